"""How many tokens an answer may take, and which tokens end it."""

from __future__ import annotations

from .errors import DataError


def answer_room(model, prompt_length: int, asked: int) -> int:
    """New tokens a prompt of `prompt_length` leaves in `model`'s context (its
    max_position_embeddings), at most `asked`; 0 when the prompt fills it."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is None:
        return asked
    return max(0, min(asked, limit - prompt_length))


def window_room(prompt_length: int, max_new_tokens: int, window: int | None, earlier: bool) -> int:
    """New tokens at most for a prompt of `prompt_length`: `max_new_tokens`, within `window`
    tokens of the conversation where one is set; 0 (not written) for a prompt that fills the
    window after an answer of its conversation (`earlier`) was written, 1 for a first answer's."""
    if window is None:
        return max_new_tokens
    left = window - prompt_length
    return min(max_new_tokens, left) if left > 0 else 0 if earlier else 1


def stop_ids(model, tokenizer) -> set[int]:
    """Token ids that end a turn: the generation config's and the tokenizer's end tokens."""
    stop = model.generation_config.eos_token_id
    ids = set(stop if isinstance(stop, list) else [stop] if stop is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    if not ids:
        raise DataError("the writer names no end-of-turn token (eos_token_id)")
    return ids
