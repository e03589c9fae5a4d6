"""Corpus documents -> flat token arrays (code files and chat pairs), cached as .npy files."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..architectures.output_folders import fresh_file
from .chat_pairs import iter_function_pairs
from .corpus import SourceFile, read_source

logger = logging.getLogger(__name__)

TOKEN_DTYPE = np.uint16  # vocabularies here stay below 65,536


@dataclass
class CorpusStats:
    """Counts of what went into one split."""

    files: int = 0
    skipped_files: int = 0
    code_bytes: int = 0
    chat_pairs: int = 0


def iter_split_texts(
    files: Sequence[SourceFile], split: str, max_file_bytes: int, stats: CorpusStats
) -> Iterator[str]:
    """The text of every readable file of `split`, counting what was read and skipped."""
    for source in files:
        if source.split != split:
            continue
        text = read_source(source, max_file_bytes)
        if text is None:
            stats.skipped_files += 1
            continue
        stats.files += 1
        stats.code_bytes += len(text)
        yield text


def render_chat_documents(texts: Iterable[str], tokenizer, stats: CorpusStats) -> Iterator[str]:
    """Chat-template renderings of every documented function in `texts`."""
    for text in texts:
        for pair in iter_function_pairs(text):
            stats.chat_pairs += 1
            yield tokenizer.apply_chat_template(pair.as_messages(), tokenize=False)


def encode_documents(texts: Iterable[str], tokenizer, batch_size: int = 256) -> np.ndarray:
    """Token ids of all `texts`, each followed by EOS, concatenated."""
    backend = tokenizer.backend_tokenizer
    eos = tokenizer.eos_token_id
    if len(tokenizer) > np.iinfo(TOKEN_DTYPE).max:
        raise ValueError(f"vocabulary of {len(tokenizer)} does not fit {TOKEN_DTYPE.__name__}")
    chunks: list[np.ndarray] = []
    batch: list[str] = []

    def flush() -> None:
        for encoding in backend.encode_batch(batch, add_special_tokens=False):
            ids = np.asarray([*encoding.ids, eos], dtype=TOKEN_DTYPE)
            chunks.append(ids)
        batch.clear()

    for text in texts:
        batch.append(text)
        if len(batch) >= batch_size:
            flush()
    if batch:
        flush()
    if not chunks:
        return np.zeros(0, dtype=TOKEN_DTYPE)
    return np.concatenate(chunks)


def save_tokens(tokens: np.ndarray, path: Path) -> None:
    """Write a token array atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with fresh_file(path, "wb") as handle:
        np.save(handle, tokens)


def load_tokens(path: Path) -> np.ndarray:
    """Memory-map a saved token array."""
    return np.load(path, mmap_mode="r")
