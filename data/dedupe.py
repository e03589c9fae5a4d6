"""Which evaluation prompts overlap the training data (held-out checks for `draftzoo eval`).

Texts are compared as lower-cased word sequences (`\\w+` runs that hold a letter, so spacing,
punctuation and case do not hide a copy, and lists of numbers such as `[1, 2, 3, 4, 5, 6, 7,
8]`, which any two texts may share, are not words). A prompt overlaps the training data when
one of its `n`-word windows appears in any training turn, user or assistant, or, for a prompt
shorter than `n` words, when a training turn is exactly its words. n = 8 by default: long
enough that common phrases do not match, short enough that a copied sentence does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..architectures.packaged_files import sha256_of
from .conversations import RowReport, iter_rows, iter_samples

#: words per window compared
NGRAM = 8
_WORD = re.compile(r"\w*[^\W\d_]\w*")


def words(text: str) -> list[str]:
    """The text's words (runs of letters, digits and underscores holding a letter),
    lower-cased."""
    return _WORD.findall(text.casefold())


def _windows(tokens: list[str], n: int) -> Iterable[int]:
    for start in range(len(tokens) - n + 1):
        yield hash(tuple(tokens[start : start + n]))


@dataclass
class TrainingText:
    """Every `n`-word window (and every short turn whole) of some training sources."""

    n: int = NGRAM
    sources: list[dict] = field(default_factory=list)  # {"source", "sha256", "rows"} each
    _windows: set[int] = field(default_factory=set, repr=False)
    _short: set[tuple[str, ...]] = field(default_factory=set, repr=False)

    def add_text(self, text: str) -> None:
        tokens = words(text)
        if len(tokens) < self.n:
            self._short.add(tuple(tokens))
        self._windows.update(_windows(tokens, self.n))

    def add_source(self, source: str) -> None:
        """Every turn of a training source (a data.source: .jsonl/.json/.parquet or a name)."""
        report = RowReport()
        for sample in iter_samples(iter_rows(source), "auto", False, report):
            for message in sample.messages or ({"content": sample.text or ""},):
                self.add_text(message.get("content") or "")
        path = Path(source)
        digest = sha256_of(path) if path.is_file() else None
        self.sources.append({"source": str(source), "sha256": digest, "rows": report.kept})

    def overlaps(self, text: str) -> bool:
        """Whether `text` shares an `n`-word window with the training text (a shorter text:
        equals a training turn)."""
        tokens = words(text)
        if len(tokens) < self.n:
            return tuple(tokens) in self._short
        return any(window in self._windows for window in _windows(tokens, self.n))


def training_text(sources: Iterable[str], n: int = NGRAM) -> TrainingText:
    """The training text of `sources`, indexed for `overlaps`."""
    text = TrainingText(n)
    for source in sources:
        text.add_source(source)
    return text
