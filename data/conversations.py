"""Conversations from local files or the hub, normalised to OpenAI-style messages.

Three row formats are read (`format: auto` tells them apart per row):
- ShareGPT: `{"conversations": [{"from": "human" | "gpt" | "system", "value": ...}]}`
- OpenAI messages: `{"messages": [{"role": "user" | "assistant" | "system", "content": ...}]}`
- plain text: `{"text": ...}` (every token is supervised)

A row that fits none of them, or a conversation with no assistant turn, is *malformed*: it is
counted with its reason and row number, and a strict run stops on the first one. Nothing is
dropped without a word.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import DataError

ROW_FORMATS = ("auto", "sharegpt", "messages", "text")
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "system": "system",
}
_MESSAGE_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Sample:
    """One normalised row: chat messages, or a plain text."""

    row: int  # index of the row in its source
    messages: tuple[dict[str, str], ...] | None = None
    text: str | None = None


@dataclass
class RowReport:
    """What happened to the rows of one source."""

    rows: int = 0
    kept: int = 0
    malformed: Counter = field(default_factory=Counter)  # reason -> count
    examples: list[str] = field(default_factory=list)  # the first few "row N: reason"
    #: regeneration: answers whose length was cut to the room the writer's context leaves
    capped: int = 0
    #: regeneration: assistant turns not written because their prompt filled the training
    #: window (each ends its conversation there)
    beyond_window: int = 0

    def add_malformed(self, row: int, reason: str) -> None:
        self.malformed[reason] += 1
        if len(self.examples) < 5:
            self.examples.append(f"row {row}: {reason}")

    def to_dict(self) -> dict[str, Any]:
        out = {
            "rows": self.rows,
            "kept": self.kept,
            "malformed": dict(self.malformed),
            "examples": list(self.examples),
        }
        if self.capped:
            out["capped"] = self.capped
        if self.beyond_window:
            out["beyond_window"] = self.beyond_window
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RowReport:
        return cls(
            data["rows"],
            data["kept"],
            Counter(data["malformed"]),
            list(data["examples"]),
            data.get("capped", 0),
            data.get("beyond_window", 0),
        )

    def summary(self) -> str:
        """One line for logs and the CLI."""
        bad = sum(self.malformed.values())
        line = f"{self.rows} rows: {self.kept} kept, {bad} rejected"
        if bad:
            line += " (" + "; ".join(f"{n} x {r}" for r, n in self.malformed.most_common()) + ")"
        return line


class MalformedRow(ValueError):
    """Why one row cannot be used."""


def _sharegpt(turns: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(turns, list) or not turns:
        raise MalformedRow("'conversations' is not a non-empty list")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            raise MalformedRow(f"turn {i} lacks 'from'/'value'")
        role = _SHAREGPT_ROLES.get(str(turn["from"]).lower())
        if role is None:
            raise MalformedRow(f"turn {i} has unknown speaker {turn['from']!r}")
        if not isinstance(turn["value"], str):
            raise MalformedRow(f"turn {i} value is not a string")
        messages.append({"role": role, "content": turn["value"]})
    return tuple(messages)


def _messages(turns: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(turns, list) or not turns:
        raise MalformedRow("'messages' is not a non-empty list")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or "role" not in turn or "content" not in turn:
            raise MalformedRow(f"message {i} lacks 'role'/'content'")
        if turn["role"] not in _MESSAGE_ROLES:
            raise MalformedRow(f"message {i} has unknown role {turn['role']!r}")
        if not isinstance(turn["content"], str):
            raise MalformedRow(f"message {i} content is not a string")
        messages.append({"role": turn["role"], "content": turn["content"]})
    return tuple(messages)


@dataclass(frozen=True)
class InvalidJson:
    """A line of a .jsonl file that is not JSON (kept so that it is counted, not lost)."""

    error: str


def normalise_row(row: Any, index: int, row_format: str = "auto") -> Sample:
    """One raw row -> `Sample`, or `MalformedRow` saying why not."""
    if isinstance(row, InvalidJson):
        raise MalformedRow(f"invalid JSON ({row.error})")
    if not isinstance(row, dict):
        raise MalformedRow(f"row is a {type(row).__name__}, not a mapping")
    kind = row_format
    if kind == "auto":
        present = [k for k in ("conversations", "messages", "text") if row.get(k) is not None]
        if len(present) != 1:
            raise MalformedRow(
                "expected exactly one of 'conversations', 'messages', 'text'"
                + (f"; found {present}" if present else f"; keys: {sorted(row)}")
            )
        kind = {"conversations": "sharegpt", "messages": "messages", "text": "text"}[present[0]]
    if kind == "text":
        text = row.get("text")
        if not isinstance(text, str) or not text:
            raise MalformedRow("'text' is missing or empty")
        return Sample(row=index, text=text)
    messages = _sharegpt(row.get("conversations")) if kind == "sharegpt" else None
    if kind == "messages":
        messages = _messages(row.get("messages"))
    if not any(m["role"] == "assistant" for m in messages):
        raise MalformedRow("conversation has no assistant turn")
    return Sample(row=index, messages=messages)


def iter_samples(
    rows: Iterable[Any], row_format: str, strict: bool, report: RowReport
) -> Iterator[Sample]:
    """Normalise `rows`, counting malformed ones in `report` (strict: raise on the first)."""
    if row_format not in ROW_FORMATS:
        raise DataError(f"unknown row format {row_format!r}; known: {', '.join(ROW_FORMATS)}")
    for index, row in enumerate(rows):
        report.rows += 1
        try:
            sample = normalise_row(row, index, row_format)
        except MalformedRow as err:
            if strict:
                raise DataError(f"malformed row {index}: {err} (strict mode)") from err
            report.add_malformed(index, str(err))
            continue
        report.kept += 1
        yield sample


def iter_rows(source: str | Path, split: str = "train") -> Iterator[Any]:
    """Raw rows of a local .jsonl/.json/.parquet file, a saved dataset folder, a hub dataset,
    or a named source (`named_sources`: `testbed-chat`, `sharegpt`).

    .jsonl lines are parsed one by one so that a broken line (not JSON, not UTF-8, nested too
    deeply to parse) becomes one malformed row instead of failing the whole file. Other sources
    go through `datasets`; hub names use `datasets.load_dataset(name, split=...)`, which needs
    network access.
    """
    import json

    from .named_sources import named_source

    named = named_source(str(source))
    if named is not None:
        yield from named.rows()
        return
    path = Path(source)
    if path.is_file() and path.suffix.lower() == ".jsonl":
        with path.open("rb") as handle:
            for raw in handle:
                if not raw.strip():
                    continue
                try:
                    yield json.loads(raw.decode("utf-8"))
                except (json.JSONDecodeError, UnicodeDecodeError) as err:
                    yield InvalidJson(str(err))
                except RecursionError:
                    yield InvalidJson("nested too deeply to parse")
        return
    yield from _load_with_datasets(str(source), split)


def _load_with_datasets(source: str, split: str):
    import datasets

    path = Path(source)
    if path.is_file():
        builder = {".json": "json", ".parquet": "parquet"}.get(path.suffix.lower())
        if builder is None:
            raise DataError(
                f"{source}: unsupported file type {path.suffix!r} (jsonl, json, parquet)"
            )
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    if path.is_dir():
        return datasets.load_from_disk(str(path))
    if source.startswith((".", "/", "~")) or path.suffix in (".json", ".jsonl", ".parquet"):
        raise DataError(f"dataset file not found: {source}")
    return datasets.load_dataset(source, split=split)
