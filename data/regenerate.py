"""Replace the assistant turns of conversations with the target's own answers.

EAGLE-3 and Medusa-2 train on what the target itself writes, so that the drafter learns the
distribution it will be asked to predict. Each assistant turn is regenerated in order, given
the conversation so far (earlier turns already regenerated), batched across conversations
with transformers `generate` (left padding), greedy at temperature 0 or sampled. A `writer`
model on the target's tokenizer (a trained draft LM) can write them instead: on-policy data.

The output is a .jsonl of `{"row": N, "messages": [...], "answers": [...]}` in source order,
written window by window (each window of `sort_window` batches is generated grouped by prompt
length; flushed and fsynced). With a training window (`RegenerateConfig.window`: the recipe's
data.max_length when it truncates on the right, as `draftzoo regenerate` sets it) only what
training reads is written: an answer stops where the window ends, and a later assistant turn
whose prompt already fills it is dropped with the rest of its conversation (by the original
answers' lengths, ShareGPT's first 1,100 conversations at 1,024 tokens need 0.68 M of 1.06 M
answer tokens, and none of the late turns' long prompts). A rerun keeps the rows already
written, drops a torn last line, and continues. `answers` says of each regenerated assistant
turn, in order, how many tokens the writer generated and whether it ended the turn itself
(`finished`) or stopped at its token cap or the window (`data/answer_report.py` counts them).
Plain-text rows are copied unchanged. Malformed rows are counted as in training.

A record beside the output (`<output>.regenerate.json`, naming the source) marks the file as
this command's own: an existing file without it (the source itself, any file of the user's)
is refused untouched, and so is a resume from another source, a symbolic link, or a file whose
finished rows hold a damaged line (only a torn last line, a killed run's, is cut).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..architectures.config_io import check_seed
from ..architectures.defaults import ANSWER_MAX_NEW_TOKENS, TEMPERATURE
from ..architectures.output_folders import appending, output_lock, write_text_atomically
from .answer_report import AnswerReport, answer_report
from .conversations import RowReport, Sample, iter_rows, iter_samples
from .errors import DataError
from .loss_mask import render_chat
from .shrinking_generate import generate_shrinking
from .token_dataset import DataConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegenerateConfig:
    """How answers are generated."""

    temperature: float = TEMPERATURE  # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = ANSWER_MAX_NEW_TOKENS
    batch_size: int = 8
    seed: int = 0
    limit: int | None = None  # regenerate only the first N usable rows
    #: batches whose conversations are grouped by prompt length before generating, so that a
    #: batch pads to similar lengths (1: batches in source order); written back in source order
    sort_window: int = 8
    #: the tokens of a conversation training reads (data.max_length, truncation right): an
    #: answer stops where they end (a first answer writes at least one token), and a later
    #: assistant turn whose prompt fills them is not written, nor any turn after it; None:
    #: whole conversations
    window: int | None = None
    #: new tokens a `generate` call writes before the batch's ended rows leave it (0: the
    #: batch decodes in one call until its last row ends; `shrinking_generate`)
    shrink_every: int = 16

    def __post_init__(self) -> None:
        check_seed(self.seed, "seed", DataError)
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise DataError(f"temperature must be >= 0 and finite, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise DataError(f"top_p must be in (0, 1], got {self.top_p}")
        for name in ("max_new_tokens", "batch_size", "sort_window"):
            if getattr(self, name) < 1:
                raise DataError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.limit is not None and self.limit < 1:
            raise DataError(f"limit must be >= 1, got {self.limit}")
        if self.shrink_every < 0:
            raise DataError(f"shrink_every must be >= 0, got {self.shrink_every}")
        if self.window is not None and self.window < 1:
            raise DataError(f"window must be >= 1, got {self.window}")


def training_window(data: DataConfig) -> int | None:
    """The tokens of each conversation training on `data` reads: its max_length when it cuts
    longer rows on the right (None when it drops them whole)."""
    return data.max_length if data.truncation == "right" else None


#: what the record beside an output says of the file
WRITTEN_BY = "draftzoo regenerate"


def output_record(output: Path) -> Path:
    """The record that marks `output` as written by `regenerate`."""
    return output.with_name(output.name + ".regenerate.json")


def record_answer_report(output: Path) -> AnswerReport:
    """Count what `output` holds (`answer_report`) and keep the counts in its record."""
    report = answer_report(output)
    record = output_record(output)
    kept = json.loads(record.read_text())
    kept["answers"] = report.to_dict()
    write_text_atomically(record, json.dumps(kept, indent=1))
    return report


def _source_id(source: str) -> str:
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else str(source)


def claim_output(output: Path, source: str, settings: dict | None = None) -> set[int]:
    """The rows `output` already holds (empty for a new file, whose record is written now);
    refuses, changing nothing, any output that is not this command's resumable file for
    `source` written with the same answer `settings` (a record from before settings were kept
    is taken as it is)."""
    record = output_record(output)
    for path in (output, record):
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise DataError(f"{path} is not a regular file; regenerate writes only files it made")
    if output.exists() and _source_id(source) == str(output.resolve()):
        raise DataError(f"{output} is the recipe's data source; name a new file for the answers")
    if not output.exists():
        output.parent.mkdir(parents=True, exist_ok=True)
        claim = {"written_by": WRITTEN_BY, "source": _source_id(source), "settings": settings}
        write_text_atomically(record, json.dumps(claim))
        return set()
    try:
        claimed = json.loads(record.read_text())
        owner, claimed_source = claimed["written_by"], claimed["source"]
    except (OSError, ValueError, KeyError, TypeError):
        owner = claimed_source = None
    if owner != WRITTEN_BY:
        raise DataError(
            f"{output} exists and draftzoo regenerate did not write it (no {record.name} "
            "beside it); name a new file (nothing was changed)"
        )
    if claimed_source != _source_id(source):
        raise DataError(
            f"{output} holds answers to {claimed_source}, not to {source}; name a new file or "
            "rerun with that source"
        )
    kept = claimed.get("settings")
    if kept is not None:
        kept = {"window": None, **kept}  # a record from before windows: whole conversations
    if kept is not None and settings is not None and kept != settings:
        changed = sorted(k for k in {*kept, *settings} if kept.get(k) != settings.get(k))
        said = ", ".join(f"{k} {kept.get(k)!r}" for k in changed)
        raise DataError(
            f"{output} holds answers written with {said}; resume with those settings or name a "
            "new file (its rows would mix two settings)"
        )
    return _done_rows(output)


def answer_settings(config: RegenerateConfig, writer) -> dict:
    """What decides how answers are distributed, as a resumed run must repeat it."""
    name = getattr(getattr(writer, "config", None), "_name_or_path", None)
    return {
        "temperature": config.temperature,
        "top_p": config.top_p,
        "max_new_tokens": config.max_new_tokens,
        "writer": str(name) if name else type(writer).__name__,
        "window": config.window,
    }


def _done_rows(output: Path) -> set[int]:
    """Rows already written; a torn last line (no newline: a killed write) is cut off the file,
    a damaged finished line is refused."""
    done, good_bytes = set(), 0
    with output.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n"):
                break  # the last write of a killed run
            try:
                row = json.loads(line)
                if not isinstance(row.get("messages", row.get("text")), (list, str)):
                    raise ValueError("no messages or text")
                done.add(int(row["row"]))
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                raise DataError(
                    f"{output}:{number}: not a regenerated row ({err}); repair or remove that "
                    "line, then rerun (nothing was changed)"
                ) from err
            good_bytes += len(line)
    if good_bytes != output.stat().st_size:
        logger.warning("%s: dropping a torn last line", output)
        with output.open("r+b") as handle:
            handle.truncate(good_bytes)
    return done


def _batches(samples: Iterator[Sample], size: int) -> Iterator[list[Sample]]:
    batch: list[Sample] = []
    for sample in samples:
        batch.append(sample)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def answer_room(model, prompt_length: int, asked: int) -> int:
    """New tokens a prompt of `prompt_length` leaves in `model`'s context (its
    max_position_embeddings), at most `asked`; 0 when the prompt fills it."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is None:
        return asked
    return max(0, min(asked, limit - prompt_length))


def stop_ids(model, tokenizer) -> set[int]:
    """Token ids that end a turn: the generation config's and the tokenizer's end tokens."""
    stop = model.generation_config.eos_token_id
    ids = set(stop if isinstance(stop, list) else [stop] if stop is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    if not ids:
        raise DataError("the writer names no end-of-turn token (eos_token_id)")
    return ids


def _lengths(new: torch.Tensor, stop: set[int]) -> list[dict]:
    """For each generated row: tokens before its first end token, and whether it had one."""
    ended = torch.isin(new, torch.tensor(sorted(stop), device=new.device))
    first = torch.where(ended.any(1), ended.int().argmax(1), new.shape[1])
    return [
        {"tokens": int(n), "finished": bool(e)} for n, e in zip(first, ended.any(1), strict=True)
    ]


def _encode(tokenizer, contexts: list[list[dict]], device) -> dict[str, torch.Tensor]:
    """The contexts' prompts (each ending with the generation prompt), left-padded."""
    prompts = [render_chat(tokenizer, c, add_generation_prompt=True) for c in contexts]
    encoded = tokenizer(prompts, add_special_tokens=False, return_tensors="pt", padding=True)
    return {k: v.to(device) for k, v in encoded.items()}


@torch.no_grad()
def _answer(
    model, tokenizer, encoded: dict[str, torch.Tensor], config: RegenerateConfig, rooms: list[int]
) -> tuple[list[str], list[dict], int]:
    """`model`'s answers to the `encoded` prompts, each at most its `rooms` tokens, their
    lengths (`_lengths`), and how many were capped to the room the writer's context leaves
    (the batch's longest prompt sets it; a prompt that fills the context gets an empty answer,
    counted)."""
    count = encoded["input_ids"].shape[0]
    room = answer_room(model, encoded["input_ids"].shape[1], config.max_new_tokens)
    capped = count if room < config.max_new_tokens else 0
    if room == 0:
        return [""] * count, [{"tokens": 0, "finished": False}] * count, capped
    sampling = {"do_sample": False}
    if config.temperature > 0:
        sampling = {"do_sample": True, "temperature": config.temperature, "top_p": config.top_p}
    stop = stop_ids(model, tokenizer)
    new = generate_shrinking(
        model,
        encoded,
        min(room, max(rooms)),
        rooms,
        stop,
        config.shrink_every,
        pad_token_id=tokenizer.pad_token_id,
        **sampling,
    )
    lengths = _lengths(new, stop)
    answers = []
    for r, ids in enumerate(new):
        if lengths[r]["tokens"] >= rooms[r]:  # not ended within its own room: cut there
            ids = ids[: rooms[r]]
            lengths[r] = {"tokens": rooms[r], "finished": False}
        answers.append(tokenizer.decode(ids, skip_special_tokens=True).strip())
    return answers, lengths, capped


def _window_rooms(encoded: dict, config: RegenerateConfig, answered: list[bool]) -> list[int]:
    """Each prompt's new tokens at most: `max_new_tokens`, within `config.window` of the
    conversation where one is set; 0 (not written) for a prompt that fills the window after an
    answer of its conversation was written, 1 for a first answer's."""
    lengths = encoded["attention_mask"].sum(1).tolist()
    if config.window is None:
        return [config.max_new_tokens] * len(lengths)
    rooms = []
    for length, earlier in zip(lengths, answered, strict=True):
        left = config.window - length
        rooms.append(min(config.max_new_tokens, left) if left > 0 else 0 if earlier else 1)
    return rooms


def _prompt_tokens(tokenizer, sample: Sample) -> int:
    """Tokens before the sample's first assistant turn (0 for plain text)."""
    if not sample.messages:
        return 0
    roles = [m["role"] for m in sample.messages]
    context = list(sample.messages[: roles.index("assistant") if "assistant" in roles else None])
    prompt = render_chat(tokenizer, context, add_generation_prompt=True)
    return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def _answer_turns(
    writer, tokenizer, batch: list[Sample], config: RegenerateConfig, report: RowReport
) -> tuple[dict, dict]:
    """({row: messages with every assistant turn rewritten in order}, {row: the answers'
    lengths}) for one batch; capped answers are counted in `report`, and with a window the
    turns not written because their prompt filled it (`_window_rooms`)."""
    rows = {s.row: list(s.messages) if s.messages else None for s in batch}
    lengths: dict[int, list[dict]] = {r: [] for r in rows}
    turns = max((len(m) for m in rows.values() if m), default=0)
    for turn in range(turns):
        asking = [
            r for r, m in rows.items() if m and turn < len(m) and m[turn]["role"] == "assistant"
        ]
        if not asking:
            continue
        encoded = _encode(tokenizer, [rows[r][:turn] for r in asking], writer.device)
        rooms = _window_rooms(encoded, config, [bool(lengths[r]) for r in asking])
        if 0 in rooms:  # those conversations end with their last answer in the window
            for r in [r for r, room in zip(asking, rooms, strict=True) if room == 0]:
                report.beyond_window += sum(m["role"] == "assistant" for m in rows[r][turn:])
                last = max(i for i, m in enumerate(rows[r][:turn]) if m["role"] == "assistant")
                rows[r] = rows[r][: last + 1]
            keep = [i for i, room in enumerate(rooms) if room]
            if not keep:
                continue
            asking, rooms = [asking[i] for i in keep], [rooms[i] for i in keep]
            # the prompts are left-padded: the kept rows, less the padding only others needed
            width = int(encoded["attention_mask"][keep].sum(1).max())
            encoded = {k: v[keep][:, -width:] for k, v in encoded.items()}
        answers, answered, capped = _answer(writer, tokenizer, encoded, config, rooms)
        report.capped += capped
        for r, answer, length in zip(asking, answers, answered, strict=True):
            rows[r][turn] = {"role": "assistant", "content": answer}
            lengths[r].append(length)
    return rows, lengths


def regenerate(
    adapter, data: DataConfig, output: Path, config: RegenerateConfig, writer=None
) -> tuple[int, RowReport]:
    """Write regenerated conversations to `output`; returns (rows written now, report).

    `writer` is the causal LM that writes the answers: the target (default), or a draft model
    on the same tokenizer for on-policy distillation data.
    """
    output = Path(output)
    with output_lock(output, "regenerate", DataError):
        return _regenerate(adapter, data, output, config, writer)


def _regenerate(adapter, data: DataConfig, output: Path, config: RegenerateConfig, writer):
    writer = adapter.model if writer is None else writer
    fresh = not output.exists()
    done = claim_output(output, data.source, answer_settings(config, writer))
    tokenizer = adapter.tokenizer
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(config.seed)
    report = RowReport()
    samples = iter_samples(iter_rows(data.source, data.split), data.format, data.strict, report)
    if config.limit is not None:
        samples = itertools.islice(samples, config.limit)  # stop reading there
    written = 0
    pending = (s for s in samples if s.row not in done)
    with appending(output) as handle:
        for window in _batches(pending, config.batch_size * config.sort_window):
            by_length = sorted(window, key=lambda s: _prompt_tokens(tokenizer, s))
            messages: dict[int, list[dict] | None] = {}
            lengths: dict[int, list[dict]] = {}
            for batch in _batches(iter(by_length), config.batch_size):
                answered, answer_lengths = _answer_turns(writer, tokenizer, batch, config, report)
                messages.update(answered)
                lengths.update(answer_lengths)
            for sample in window:
                record = {"row": sample.row}
                if sample.text is not None:
                    record["text"] = sample.text
                else:
                    record["messages"] = messages[sample.row]
                    record["answers"] = lengths[sample.row]
                handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            written += len(window)
    if report.kept == 0 and not done:
        if fresh:  # a refused run leaves nothing behind
            output.unlink(missing_ok=True)
            output_record(output).unlink(missing_ok=True)
        raise DataError(
            f"{data.source}: no usable rows ({report.summary()}); first problems: "
            f"{'; '.join(report.examples)}"
        )
    if report.capped:
        logger.warning(
            "%d answers were cut to the room the writer's context (%s positions) leaves",
            report.capped,
            getattr(writer.config, "max_position_embeddings", "?"),
        )
    logger.info("regenerated %d rows into %s (%s)", written, output, report.summary())
    return written, report
