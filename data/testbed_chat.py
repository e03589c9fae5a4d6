"""`testbed-chat`: the testbed's instruction pairs as a conversation source, training split only.

Each documented function of the corpus's *training* split becomes one conversation (user:
instruction + signature + docstring; assistant: the function), in corpus order, split exactly
as `testbed-small` was (held-out modules never appear).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

from ..architectures.output_folders import fresh_file, output_path
from .chat_pairs import iter_function_pairs
from .corpus import CorpusSpec, fingerprint_files, list_sources, read_source
from .errors import DataError

TESTBED_CHAT = "testbed-chat"


def testbed_chat_spec() -> CorpusSpec:
    """The corpus of `testbed-small` (recipes/testbed/testbed-small.yaml)."""
    return CorpusSpec(heldout_percent=6.0)


def iter_testbed_chat_rows(spec: CorpusSpec | None = None) -> Iterator[dict]:
    """Rows `{"messages": [...]}` of every training-split instruction pair."""
    spec = spec or testbed_chat_spec()
    for source in list_sources(spec):
        if source.split != "train":
            continue
        text = read_source(source, spec.max_file_bytes)
        for pair in iter_function_pairs(text or ""):
            yield {"messages": pair.as_messages()}


def testbed_chat_hash(spec: CorpusSpec | None = None) -> str:
    """A hash of the files the source reads (paths, splits, sizes)."""
    spec = spec or testbed_chat_spec()
    return hashlib.sha256(fingerprint_files(list_sources(spec)).encode()).hexdigest()[:16]


def export_testbed_chat(path: Path, max_rows: int | None = None) -> int:
    """Write the rows to a `.jsonl` file (whole, then renamed); the number written.

    The file is a `data.source` that tokenizes to the same rows as `testbed-chat` on machines
    whose installed Python and packages differ (and so would build other conversations)."""
    if max_rows is not None and max_rows < 1:
        raise DataError(f"max_rows must be >= 1, got {max_rows}")
    path = output_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with fresh_file(path) as handle:
        for row in islice(iter_testbed_chat_rows(), max_rows):
            handle.write(json.dumps(row) + "\n")
            count += 1
    return count
