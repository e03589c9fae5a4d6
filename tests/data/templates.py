"""Chat templates of the Llama-3 and Qwen2.5 instruct models, on a tokenizer built offline."""

from __future__ import annotations

import copy

#: The chat template Meta ships with Llama-3-8B-Instruct.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

#: The Qwen2.5-Instruct template without its tool-calling branches.
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


def with_template(base, kind: str):
    """A copy of tokenizer `base` with the special tokens and template of `kind`."""
    tokenizer = copy.deepcopy(base)
    if kind == "llama3":
        specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        tokenizer.add_special_tokens({"additional_special_tokens": specials})
        tokenizer.bos_token = "<|begin_of_text|>"
        tokenizer.chat_template = LLAMA3_TEMPLATE
    elif kind == "qwen":
        tokenizer.chat_template = QWEN25_TEMPLATE
    else:
        raise ValueError(kind)
    return tokenizer
