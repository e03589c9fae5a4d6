"""Conversations -> token ids + an assistant-only loss mask, for any chat template.

The mask is found without knowing the template: for each assistant turn i, the text the
template renders for `messages[:i]` with the generation prompt must be a prefix of what it
renders for `messages[:i+1]`; the characters between the two (trailing whitespace removed) are
that turn's answer including its end-of-turn marker — exactly what the model must learn to
write. Tokens whose first character lies inside such a span are supervised. A template that is
not prefix-stable this way (or cannot render) raises `TemplateError` instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..architectures.errors import DraftzooError
from .conversations import Sample


class TemplateError(DraftzooError, ValueError):
    """The tokenizer's chat template cannot render a conversation or mark its answers."""


@dataclass(frozen=True)
class Tokenized:
    """One tokenized sample."""

    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token is supervised (assistant text, or plain text)


def render_chat(tokenizer, messages, add_generation_prompt: bool = False) -> str:
    """The tokenizer's chat template rendered on `messages` (text). Every way it can fail — a
    template that raises, reaches outside jinja2's sandbox, or loops past its bounds — is a
    `TemplateError`: one line, never a traceback. The one place draftzoo renders a target's
    template."""
    try:
        return tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception as err:  # jinja2 raises many types; all mean "cannot render"
        raise TemplateError(f"the chat template cannot render this conversation: {err}") from err


def assistant_spans(tokenizer, messages) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the [start, end) character spans of its answers."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise TemplateError(
            f"{type(tokenizer).__name__} has no chat template; set tokenizer.chat_template "
            "or use plain-text rows"
        )
    spans, renderings = [], []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = render_chat(tokenizer, messages[:i], add_generation_prompt=True)
        upto = render_chat(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if not upto.startswith(prefix):
            raise TemplateError(
                f"assistant turn {i}: the template's rendering of the turns before it (with the "
                "generation prompt) is not a prefix of the rendering that includes it, so the "
                "answer's tokens cannot be located"
            )
        end = len(upto.rstrip())
        if end <= len(prefix):
            raise TemplateError(f"assistant turn {i} renders to nothing")
        spans.append((len(prefix), end))
        renderings.append(upto[:end])
    full = render_chat(tokenizer, messages, add_generation_prompt=False)
    if not all(full.startswith(upto) for upto in renderings):
        raise TemplateError("the template renders earlier turns differently once later ones follow")
    return full, spans


def tokenize_sample(tokenizer, sample: Sample) -> Tokenized:
    """Token ids and the loss mask of one conversation or plain text.

    Rows are cut to length later (packing, truncation), so the tokenizer's warning about text
    longer than the model's maximum is silenced (`verbose=False`).
    """
    if sample.text is not None:
        ids = tokenizer(sample.text, add_special_tokens=False, verbose=False)["input_ids"]
        if tokenizer.eos_token_id is not None:
            ids = [*ids, tokenizer.eos_token_id]
        return Tokenized(input_ids=ids, loss_mask=[1] * len(ids))
    text, spans = assistant_spans(tokenizer, sample.messages)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    mask = []
    span_index = 0
    for start, _ in encoded["offset_mapping"]:
        while span_index < len(spans) and start >= spans[span_index][1]:
            span_index += 1
        inside = span_index < len(spans) and spans[span_index][0] <= start
        mask.append(int(inside))
    return Tokenized(input_ids=list(encoded["input_ids"]), loss_mask=mask)
