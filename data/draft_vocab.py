"""The pruned draft vocabulary of EAGLE-3: the most frequent supervised tokens.

Counted over loss-masked tokens only (what the drafter will be asked to predict). Stored as the
engines store it: `d2t` [draft_vocab] int64 with target_id = draft_id + d2t[draft_id] (draft ids
follow ascending target ids), and `t2d` [vocab] bool marking the target ids kept.
"""

from __future__ import annotations

import torch

from ..architectures.errors import DraftzooError


class DraftVocabError(DraftzooError, ValueError):
    """A draft vocabulary that the data cannot fill."""


def count_supervised_tokens(dataset, vocab_size: int) -> torch.Tensor:
    """Counts [vocab_size] of every token that is a supervised prediction target."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in zip(dataset["input_ids"], dataset["loss_mask"], strict=True):
        ids_t = torch.tensor(ids, dtype=torch.long)
        keep = torch.tensor(mask, dtype=torch.bool)
        keep[0] = False  # the first token is never predicted
        counts += torch.bincount(ids_t[keep], minlength=vocab_size)[:vocab_size]
    return counts


def build_vocab_map(
    counts: torch.Tensor, draft_vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) for the `draft_vocab_size` most frequent tokens of `counts`."""
    seen = int((counts > 0).sum())
    if draft_vocab_size > seen:
        raise DraftVocabError(
            f"draft_vocab_size {draft_vocab_size} is larger than the {seen} distinct tokens "
            "the training data supervises; lower it or add data"
        )
    # stable order: by count, ties by lower id
    order = sorted(range(len(counts)), key=lambda i: (-int(counts[i]), i))
    kept = torch.tensor(sorted(order[:draft_vocab_size]), dtype=torch.long)
    d2t = kept - torch.arange(draft_vocab_size)
    t2d = torch.zeros(len(counts), dtype=torch.bool)
    t2d[kept] = True
    return d2t, t2d


def coverage(counts: torch.Tensor, t2d: torch.Tensor) -> float:
    """Share of supervised tokens that fall inside the draft vocabulary."""
    total = int(counts.sum())
    return float(counts[t2d].sum()) / total if total else 0.0
