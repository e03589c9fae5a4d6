"""A run's draft vocabulary: the most frequent supervised tokens of its data.

EAGLE-3 and Medusa train their heads over it (chosen before the first step); EAGLE-1, MTP and
DFlash train over the target's whole head and get it at export (`truncate_at_export`), so they
draft through those rows of the target's head (architectures/target_head.py); the draft LM
trains over its whole head and ships the map beside its weights (`map_at_export`).
"""

from __future__ import annotations

import logging

import torch

from ..architectures.target_head import install_vocab_map
from ..data.draft_vocab import build_vocab_map, count_supervised_tokens, coverage

logger = logging.getLogger(__name__)


def draft_vocab(config, dataset, vocab_size: int):
    """(d2t, t2d, coverage) of the `config.draft_vocab_size` most frequent supervised tokens of
    `dataset` (identity when not pruned)."""
    size = config.draft_vocab_size or vocab_size
    if size == vocab_size:
        return torch.zeros(size, dtype=torch.long), torch.ones(size, dtype=torch.bool), 1.0
    counts = count_supervised_tokens(dataset, vocab_size)
    d2t, t2d = build_vocab_map(counts, size)
    return d2t, t2d, coverage(counts, t2d)


def map_at_export(run, config, how: str):
    """(d2t, t2d, the training record's fields) of the draft vocabulary
    `config.draft_vocab_size` asks for, `how` the record's words for where it applies; None
    for the whole vocabulary."""
    vocab = run.target.lm_head.weight.shape[0]
    if config.draft_vocab_size is None or config.draft_vocab_size >= vocab:
        return None
    d2t, t2d, covered = draft_vocab(config, run.dataset, vocab)
    logger.info(
        "draft vocabulary at export: %d of %d tokens, covering %.4f of supervised tokens",
        config.draft_vocab_size,
        vocab,
        covered,
    )
    fields = {
        "draft_vocab_size": config.draft_vocab_size,
        "draft_vocab_coverage": round(covered, 6),
        "draft_vocab": how,
    }
    return d2t, t2d, fields


def truncate_at_export(run, module, config) -> dict:
    """Install the draft vocabulary `config.draft_vocab_size` asks for in the bare drafter
    `module` (every process, before the export); the training record's fields ({} for the
    whole vocabulary)."""
    found = map_at_export(run, config, "the target's head truncated at export")
    if found is None:
        return {}
    d2t, t2d, fields = found
    install_vocab_map(module, d2t, t2d)
    return fields
