"""Assistant-only loss masks, exact at template boundaries, for three chat templates."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from draftzoo.data.conversations import Sample
from draftzoo.data.loss_mask import TemplateError, tokenize_sample
from draftzoo.train.testbed import committed_testbed_dir
from tests.data.templates import with_template

CONVERSATION = (
    {"role": "system", "content": "Answer in code."},
    {"role": "user", "content": "Add one."},
    {"role": "assistant", "content": "def inc(x):\n    return x + 1"},
    {"role": "user", "content": "And two?"},
    {"role": "assistant", "content": " x + 2 "},
)


@pytest.fixture(scope="module")
def testbed_tokenizer():
    return AutoTokenizer.from_pretrained(committed_testbed_dir())


def supervised_runs(tokenizer, tokenized) -> list[str]:
    """The text of each maximal run of supervised tokens."""
    runs, current = [], []
    for token, keep in zip(tokenized.input_ids, tokenized.loss_mask, strict=True):
        if keep:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    if current:
        runs.append(tokenizer.decode(current))
    return runs


def text_before_runs(tokenizer, tokenized) -> list[str]:
    """The decoded unsupervised text right before each supervised run (its last 80 chars)."""
    out, ids = [], tokenized.input_ids
    for i, keep in enumerate(tokenized.loss_mask):
        if keep and (i == 0 or not tokenized.loss_mask[i - 1]):
            out.append(tokenizer.decode(ids[:i])[-80:])
    return out


def test_testbed_template_hand_checked_and_equal_to_generation_markers(testbed_tokenizer):
    tokenized = tokenize_sample(testbed_tokenizer, Sample(0, messages=CONVERSATION))
    assert supervised_runs(testbed_tokenizer, tokenized) == [
        "def inc(x):\n    return x + 1<|im_end|>",
        " x + 2 <|im_end|>",
    ]
    assert all(
        t.endswith("<|im_start|>assistant\n")
        for t in text_before_runs(testbed_tokenizer, tokenized)
    )
    # the testbed template marks answers with {% generation %}; transformers' own mask agrees
    reference = testbed_tokenizer.apply_chat_template(
        list(CONVERSATION), tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert tokenized.input_ids == list(reference["input_ids"])
    assert tokenized.loss_mask == list(reference["assistant_masks"])


def test_llama3_template_hand_checked(testbed_tokenizer):
    tokenizer = with_template(testbed_tokenizer, "llama3")
    tokenized = tokenize_sample(tokenizer, Sample(0, messages=CONVERSATION))
    # the template trims content; the end-of-turn token is learned, the header is not
    assert supervised_runs(tokenizer, tokenized) == [
        "def inc(x):\n    return x + 1<|eot_id|>",
        "x + 2<|eot_id|>",
    ]
    before = text_before_runs(tokenizer, tokenized)
    assert all(t.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n") for t in before)
    assert tokenizer.decode(tokenized.input_ids[:1]) == "<|begin_of_text|>"
    assert tokenized.loss_mask[-1] == 1  # the final <|eot_id|>


def test_qwen_template_hand_checked(testbed_tokenizer):
    tokenizer = with_template(testbed_tokenizer, "qwen")
    messages = CONVERSATION[1:]  # no system turn: the template inserts its default one
    tokenized = tokenize_sample(tokenizer, Sample(0, messages=messages))
    assert supervised_runs(tokenizer, tokenized) == [
        "def inc(x):\n    return x + 1<|im_end|>",
        " x + 2 <|im_end|>",
    ]
    text = tokenizer.decode(tokenized.input_ids)
    assert text.startswith("<|im_start|>system\nYou are Qwen")
    assert text.endswith("<|im_end|>\n")
    assert tokenized.loss_mask[-1] == 0  # the newline after <|im_end|> is template, not answer


def test_plain_text_is_fully_supervised_and_ends_with_eos(testbed_tokenizer):
    tokenized = tokenize_sample(testbed_tokenizer, Sample(0, text="import os\n"))
    assert all(tokenized.loss_mask)
    assert tokenized.input_ids[-1] == testbed_tokenizer.eos_token_id


def test_template_that_rewrites_earlier_turns_is_refused(testbed_tokenizer):
    tokenizer = with_template(testbed_tokenizer, "qwen")
    # numbers every turn by the total count: adding a turn changes all earlier text
    tokenizer.chat_template = (
        "{% for m in messages %}[{{ messages | length }}]{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(TemplateError, match="not a prefix"):
        tokenize_sample(tokenizer, Sample(0, messages=CONVERSATION[1:3]))


def test_template_that_cannot_render_is_a_clear_error(testbed_tokenizer):
    tokenizer = with_template(testbed_tokenizer, "qwen")
    tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(TemplateError, match="cannot render"):
        tokenize_sample(tokenizer, Sample(0, messages=CONVERSATION[1:3]))
    tokenizer.chat_template = None
    with pytest.raises(TemplateError, match="no chat template"):
        tokenize_sample(tokenizer, Sample(0, messages=CONVERSATION[1:3]))
