"""Regeneration by continuous batching: every slot of the batch keeps writing.

Batched `generate` answers one turn of a batch of conversations at a time: the batch waits for
its longest answer, and a conversation's next turn waits for the whole batch. Here transformers'
continuous-batching manager (`generate_batch`'s engine: a paged KV cache, requests joining and
leaving between forwards) holds up to `batch_size` answers in flight; as soon as an answer is
back, its conversation's next assistant turn is asked, so a slot is refilled the step after it
frees. Each request is one turn's prompt (the conversation so far, earlier answers already
rewritten), so every answer is drawn as `generate` would draw it; greedy answers can differ from
a padded batch's only where float rounding under another batch flips a near-tie.
"""

from __future__ import annotations

import logging
import math

from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from .answer_rooms import answer_room, stop_ids, window_room
from .conversations import RowReport, Sample
from .errors import DataError
from .loss_mask import render_chat

logger = logging.getLogger(__name__)

#: tokens of the KV cache's pages (transformers' default)
PAGE_TOKENS = 256
#: tokens one forward processes at most, prompts' chunks and decoding rows together: a CPU's
#: forward is compute-bound far below it, and a long prompt no longer stalls the others
FORWARD_TOKENS = 1024
#: seconds without any answer back before the manager is taken to have failed
STALL_SECONDS = 600.0


def cache_tokens(writer, slots: int, window: int | None, max_new_tokens: int) -> int:
    """Tokens the paged cache holds: `slots` conversations of the training window plus an
    answer each (without a window, the writer's whole context each)."""
    context = getattr(writer.config, "max_position_embeddings", None)
    each = window + max_new_tokens if window is not None else context
    if each is None:
        raise DataError(
            "continuous batching sizes its cache by the training window or the writer's "
            "context (max_position_embeddings); this writer names neither: use --batching static"
        )
    if context is not None:
        each = min(each, context)
    return slots * each


def answer_continuously(writer, tokenizer, batch: list[Sample], config, report: RowReport):
    """({row: messages with every assistant turn rewritten in order}, {row: the answers'
    lengths}) for `batch`, as `regenerate._answer_turns` gives them for one batch."""
    rows = {s.row: list(s.messages) if s.messages else None for s in batch}
    lengths: dict[int, list[dict]] = {r: [] for r in rows}
    turn_of = dict.fromkeys(rows, 0)
    stop = stop_ids(writer, tokenizer)
    rooms: dict[str, int] = {}

    def ask(manager, row: int) -> bool:
        """Ask `row`'s next assistant turn; False when the conversation is done."""
        messages = rows[row]
        while messages:
            later = range(turn_of[row], len(messages))
            turn = next((i for i in later if messages[i]["role"] == "assistant"), None)
            if turn is None:
                return False
            prompt = render_chat(tokenizer, messages[:turn], add_generation_prompt=True)
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            room = window_room(len(ids), config.max_new_tokens, config.window, bool(lengths[row]))
            if room == 0:  # the conversation ends with its last answer in the window
                report.beyond_window += sum(m["role"] == "assistant" for m in messages[turn:])
                last = max(i for i, m in enumerate(messages[:turn]) if m["role"] == "assistant")
                rows[row] = messages[: last + 1]
                return False
            context_room = answer_room(writer, len(ids), config.max_new_tokens)
            if context_room < config.max_new_tokens:
                report.capped += 1
            turn_of[row] = turn + 1
            if context_room == 0:  # the prompt fills the writer's context
                messages[turn] = {"role": "assistant", "content": ""}
                lengths[row].append({"tokens": 0, "finished": False})
                continue
            request = f"{row}:{turn}"
            rooms[request] = min(room, context_room)
            manager.add_request(ids, request_id=request, max_new_tokens=rooms[request])
            return True
        return False

    with writer.continuous_batching_context_manager(
        generation_config=_generation_config(writer, config, stop),
        continuous_batching_config=_batching_config(writer, config),
        warmup=False,
    ) as manager:
        pending = sum(ask(manager, row) for row in rows)
        while pending:
            out = manager.get_result(timeout=STALL_SECONDS)
            if out is None:
                raise RuntimeError(
                    f"continuous batching returned no answer in {STALL_SECONDS:.0f} s "
                    f"({pending} pending)"
                )
            if out.error is not None:
                raise RuntimeError(f"continuous batching failed on {out.request_id}: {out.error}")
            if not out.is_finished():
                continue
            pending -= 1
            row, turn = map(int, out.request_id.split(":"))
            new = list(out.generated_tokens)[: rooms.pop(out.request_id)]
            ended = next((i for i, token in enumerate(new) if token in stop), None)
            rows[row][turn] = {
                "role": "assistant",
                "content": tokenizer.decode(new, skip_special_tokens=True).strip(),
            }
            tokens = len(new) if ended is None else ended
            lengths[row].append({"tokens": tokens, "finished": ended is not None})
            pending += ask(manager, row)
    return rows, lengths


def _generation_config(writer, config, stop: set[int]) -> GenerationConfig:
    sampling = {"do_sample": False}
    if config.temperature > 0:
        sampling = {"do_sample": True, "temperature": config.temperature, "top_p": config.top_p}
    pad = writer.generation_config.pad_token_id
    return GenerationConfig(
        max_new_tokens=config.max_new_tokens,
        eos_token_id=sorted(stop),
        pad_token_id=pad if pad is not None else min(stop),
        **sampling,
    )


def _batching_config(writer, config) -> ContinuousBatchingConfig:
    tokens = cache_tokens(writer, config.batch_size, config.window, config.max_new_tokens)
    return ContinuousBatchingConfig(
        page_size=PAGE_TOKENS,
        num_blocks=math.ceil(tokens / PAGE_TOKENS) + config.batch_size,
        max_batch_tokens=FORWARD_TOKENS,
        max_requests_per_batch=config.batch_size,
        seed=config.seed,
    )
