"""User turns written by the target itself, from its own chat template (Magpie-style).

Where no dataset is reachable, the requests a chat model is trained to answer can come from the
model: render its chat template up to the start of a user turn's content (with the template's
own default system turn, or a given one), sample from there until the turn ends, and the text
is a request of the kind the model saw in its instruction tuning. `draftzoo regenerate` then
answers them with the same model.

Each batch samples `batch_size` continuations of that one prefix (no padding needed). A turn is
kept when it ended by itself within `max_new_tokens`, has at least `min_words` words, and is
not a duplicate (case and spacing folded) of a kept one; the others are counted by reason. The
output is a .jsonl of `{"messages": [user, empty assistant], "source": ...}` rows, written and
fsynced batch by batch with a progress record beside it, so a rerun continues where a run
stopped (batch seeds follow the batch number: the same file results either way).
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..architectures.config_io import check_seed
from ..architectures.output_folders import appending, output_lock, write_text_atomically
from .errors import DataError
from .loss_mask import render_chat
from .regenerate import stop_ids

logger = logging.getLogger(__name__)

#: the `source` of every row this module writes: how a rerun knows the file is its own
SOURCE = "draftzoo user-turns"
_SENTINEL = "\ue000draftzoo-user-turn\ue000"


@dataclass(frozen=True)
class UserTurnConfig:
    """How user turns are sampled and filtered."""

    count: int = 1000  # distinct user turns wanted
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128  # a turn that does not end within this is dropped (counted)
    batch_size: int = 32
    min_words: int = 3
    seed: int = 0
    system: str | None = None  # the system turn; None: the chat template's own default

    def __post_init__(self) -> None:
        check_seed(self.seed, "seed", DataError)
        for name in ("count", "max_new_tokens", "batch_size", "min_words"):
            if getattr(self, name) < 1:
                raise DataError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not math.isfinite(self.temperature) or self.temperature <= 0:
            raise DataError(
                f"user turns are sampled: temperature must be > 0 and finite, got "
                f"{self.temperature}"
            )
        if self.min_words > self.max_new_tokens:  # every word takes at least one token
            raise DataError(
                f"min_words {self.min_words} can never be met by turns of at most "
                f"max_new_tokens {self.max_new_tokens} tokens"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise DataError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class UserTurnReport:
    """What the sampling drew and why turns were dropped."""

    batches: int = 0
    drawn: int = 0
    kept: int = 0
    unfinished: int = 0  # did not end within max_new_tokens
    too_short: int = 0
    duplicates: int = 0
    tokens: int = 0  # tokens of the kept turns
    seen: set[str] = field(default_factory=set, repr=False)

    def summary(self) -> str:
        return (
            f"{self.kept} kept of {self.drawn} drawn; dropped: {self.unfinished} unfinished, "
            f"{self.too_short} too short, {self.duplicates} duplicates; {self.tokens} tokens"
        )

    def to_dict(self) -> dict:
        counts = asdict(self)
        counts.pop("seen")
        return counts


def user_turn_prefix(tokenizer, system: str | None = None) -> str:
    """The chat template rendered up to where a user turn's content begins."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataError("the target's tokenizer has no chat template to write user turns from")
    messages = [{"role": "user", "content": _SENTINEL}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    rendered = render_chat(tokenizer, messages)
    if _SENTINEL not in rendered:
        raise DataError("the chat template does not render a user turn's content")
    return rendered.split(_SENTINEL)[0]


def _fold(text: str) -> str:
    return " ".join(text.lower().split())


def _read_progress(output: Path, progress: Path, settings: dict) -> UserTurnReport:
    """The report of the run that wrote `output` (empty when neither exists); a file that
    draftzoo did not write, one that disagrees with its progress record, or one written with
    other `settings` (a resume would mix them; only `count` may change) is refused."""
    report = UserTurnReport()
    for path in (output, progress):
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise DataError(f"{path} is not a regular file; user-turns writes only files it made")
    if not output.exists():
        if progress.exists():
            progress.unlink()  # a record whose rows are gone: start again
        return report
    if not progress.is_file():
        raise DataError(
            f"{output} exists and is not a user-turn file draftzoo wrote; name a new one"
        )
    try:
        recorded = json.loads(progress.read_text())
        report = UserTurnReport(**recorded["report"])
        kept = _settings(recorded["config"], recorded["dtype"])
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise DataError(f"{progress} is not a progress record draftzoo wrote ({err})") from err
    if kept != settings:
        changed = sorted(k for k in {*kept, *settings} if kept.get(k) != settings.get(k))
        said = ", ".join(f"{k} {kept.get(k)!r}" for k in changed)
        raise DataError(
            f"{output} holds turns sampled with {said}; resume with those settings or name a "
            "new file (its rows would mix two settings)"
        )
    good = 0
    with output.open("rb") as handle:
        for line in handle:
            if len(report.seen) == report.kept:
                break  # rows of a batch whose record was not written: that batch is redone
            row = _own_row(line, output)
            report.seen.add(_fold(row["messages"][0]["content"]))
            good += len(line)
    if len(report.seen) != report.kept:
        raise DataError(f"{output} does not hold the {report.kept} rows its progress record lists")
    if good != output.stat().st_size:
        with output.open("r+b") as handle:
            handle.truncate(good)
    return report


def _own_row(line: bytes, output: Path) -> dict:
    """A row this module wrote; anything else is refused (the file is not truncated)."""
    try:
        row = json.loads(line)
    except ValueError:
        row = None
    if not isinstance(row, dict) or row.get("source") != SOURCE:
        raise DataError(f"{output} holds a line draftzoo's user-turn writer did not write")
    return row


def _keep(text: str, finished: bool, config: UserTurnConfig, report: UserTurnReport) -> bool:
    """Whether a sampled turn is kept (the report counts why not)."""
    report.drawn += 1
    if not finished:
        report.unfinished += 1
    elif len(text.split()) < config.min_words:
        report.too_short += 1
    elif _fold(text) in report.seen:
        report.duplicates += 1
    else:
        report.seen.add(_fold(text))
        return True
    return False


@torch.no_grad()
def _sample_batch(model, tokenizer, prefix_ids: torch.Tensor, config, batch: int, stop: set[int]):
    """`batch_size` continuations of the prefix: [(text, ended by itself, tokens)]."""
    torch.manual_seed(config.seed * 1_000_003 + batch)
    ids = prefix_ids.to(model.device).repeat(config.batch_size, 1)
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        temperature=config.temperature,
        top_p=config.top_p,
        max_new_tokens=config.max_new_tokens,
        eos_token_id=sorted(stop),
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop),
    )
    turns = []
    for row in out[:, ids.shape[1] :].tolist():
        ends = [i for i, token in enumerate(row) if token in stop]
        body = row[: ends[0]] if ends else row
        turns.append(
            (tokenizer.decode(body, skip_special_tokens=True).strip(), bool(ends), len(body))
        )
    return turns


def synthesize_user_turns(model, tokenizer, output: Path, config: UserTurnConfig) -> UserTurnReport:
    """Write `config.count` distinct user turns sampled from `model` to `output` (resuming a
    run that stopped); returns the report, also kept in `<output>.progress.json`."""
    output = Path(output)
    with output_lock(output, "user-turns", DataError):
        return _synthesize(model, tokenizer, output, config)


def _settings(config: dict, dtype: str) -> dict:
    """What decides which turns a run samples: every setting but `count`, and the dtype."""
    return {**{k: v for k, v in config.items() if k != "count"}, "dtype": dtype}


def _synthesize(model, tokenizer, output: Path, config: UserTurnConfig) -> UserTurnReport:
    progress = output.with_name(output.name + ".progress.json")
    dtype = str(model.dtype).removeprefix("torch.")
    report = _read_progress(output, progress, _settings(asdict(config), dtype))
    prefix = user_turn_prefix(tokenizer, config.system)
    prefix_ids = tokenizer(prefix, add_special_tokens=False, return_tensors="pt")["input_ids"]
    stop = stop_ids(model, tokenizer)
    output.parent.mkdir(parents=True, exist_ok=True)
    if not output.exists():  # the record first: a run killed before its first rows resumes
        _write_progress(progress, report, config, dtype)
    with appending(output) as handle:
        while report.kept < config.count:
            rows = []
            for text, finished, tokens in _sample_batch(
                model, tokenizer, prefix_ids, config, report.batches, stop
            ):
                if report.kept + len(rows) < config.count and _keep(text, finished, config, report):
                    report.tokens += tokens
                    rows.append(_row(text))
            handle.writelines(json.dumps(row) + "\n" for row in rows)
            handle.flush()
            os.fsync(handle.fileno())
            report.kept += len(rows)
            report.batches += 1
            _write_progress(progress, report, config, dtype)
            logger.info("user turns: %s", report.summary())
    return report


def _row(text: str) -> dict:
    """A conversation whose user turn is `text` and whose answer regenerate writes."""
    turns = [{"role": "user", "content": text}, {"role": "assistant", "content": ""}]
    return {"messages": turns, "source": SOURCE}


def _write_progress(
    progress: Path, report: UserTurnReport, config: UserTurnConfig, dtype: str
) -> None:
    record = {"report": report.to_dict(), "config": asdict(config), "dtype": dtype}
    write_text_atomically(progress, json.dumps(record, indent=1))
