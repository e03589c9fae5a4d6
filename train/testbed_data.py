"""Prepare a testbed's training data once: corpus -> tokenizer -> token arrays, cached on disk."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..architectures.config_io import to_dict
from ..architectures.output_folders import write_text_atomically
from ..data.corpus import CorpusError, corpus_versions, fingerprint_files, list_sources
from ..data.token_stream import (
    CorpusStats,
    encode_documents,
    iter_split_texts,
    load_tokens,
    render_chat_documents,
    save_tokens,
)
from ..data.tokenizer import train_bpe_tokenizer
from .testbed_config import TestbedConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedData:
    """Paths of a prepared testbed dataset."""

    root: Path

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / "tokenizer"

    @property
    def train_tokens(self) -> Path:
        return self.root / "train.npy"

    @property
    def heldout_tokens(self) -> Path:
        return self.root / "heldout.npy"

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    def read_manifest(self) -> dict:
        """What was read and counted when the data was prepared."""
        return json.loads(self.manifest.read_text())


def data_key(config: TestbedConfig) -> str:
    """Hash of everything that determines the prepared data."""
    payload = json.dumps(
        {"corpus": to_dict(config.corpus), "tokenizer": to_dict(config.tokenizer)}, sort_keys=True
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def prepare_testbed_data(config: TestbedConfig, cache_dir: Path) -> PreparedData:
    """Build (or reuse) tokenizer and token arrays for `config` under `cache_dir`."""
    prepared = PreparedData(Path(cache_dir) / f"data-{data_key(config)}")
    if prepared.manifest.is_file():
        logger.info("reusing prepared data in %s", prepared.root)
        return prepared
    spec = config.corpus.spec()
    files = list_sources(spec)
    logger.info("corpus: %d files from %s", len(files), ", ".join(spec.origins))
    train_stats, heldout_stats = CorpusStats(), CorpusStats()
    train_texts = list(iter_split_texts(files, "train", spec.max_file_bytes, train_stats))
    heldout_texts = list(iter_split_texts(files, "heldout", spec.max_file_bytes, heldout_stats))
    if not train_texts or not heldout_texts:
        raise CorpusError(
            f"the corpus needs train and held-out files; got {len(train_texts)} train and "
            f"{len(heldout_texts)} held-out (raise max_files or heldout_percent)"
        )
    logger.info("training the %d-token BPE", config.tokenizer.vocab_size)
    tokenizer = train_bpe_tokenizer(
        train_texts[:: config.tokenizer.sample_every],
        config.tokenizer.vocab_size,
        prepared.tokenizer_dir,
    )
    logger.info("tokenizing %.1f MB of training code", train_stats.code_bytes / 1e6)
    parts = [encode_documents(train_texts, tokenizer)]
    if config.corpus.chat_pairs:
        chats = list(render_chat_documents(train_texts, tokenizer, train_stats))
        parts.append(encode_documents(chats, tokenizer))
    train_tokens = np.concatenate(parts)
    heldout_tokens = encode_documents(heldout_texts, tokenizer)
    save_tokens(train_tokens, prepared.train_tokens)
    save_tokens(heldout_tokens, prepared.heldout_tokens)
    manifest = {
        "corpus_files_hash": fingerprint_files(files),
        "versions": corpus_versions(spec),
        "train": dataclasses.asdict(train_stats) | {"tokens": int(train_tokens.size)},
        "heldout": dataclasses.asdict(heldout_stats) | {"tokens": int(heldout_tokens.size)},
        "heldout_modules": sorted({f.module for f in files if f.split == "heldout"}),
        "config": {"corpus": to_dict(config.corpus), "tokenizer": to_dict(config.tokenizer)},
    }
    write_text_atomically(prepared.manifest, json.dumps(manifest, indent=2))
    logger.info(
        "prepared %d training and %d held-out tokens", train_tokens.size, heldout_tokens.size
    )
    return prepared


def heldout_windows(heldout: np.ndarray, seq_len: int, count: int) -> np.ndarray:
    """`count` evenly spaced windows of `seq_len + 1` tokens from the held-out stream."""
    span = seq_len + 1
    if heldout.size < span:
        raise CorpusError(f"held-out text has {heldout.size} tokens, fewer than one window")
    starts = np.linspace(0, heldout.size - span, num=count).astype(np.int64)
    return np.stack([np.asarray(heldout[s : s + span], dtype=np.int64) for s in starts])


def unigram_loss(train: np.ndarray, targets: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy (nats) of `targets` under the add-one unigram model of `train`."""
    counts = np.bincount(np.asarray(train), minlength=vocab_size).astype(np.float64) + 1.0
    log_probs = np.log(counts / counts.sum())
    return float(-log_probs[np.asarray(targets, dtype=np.int64)].mean())


__all__ = [
    "PreparedData",
    "heldout_windows",
    "load_tokens",
    "prepare_testbed_data",
    "unigram_loss",
]
