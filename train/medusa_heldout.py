"""What Medusa heads (and a Medusa-2 adapter) measure on held-out rows after training.

`head_rank_accuracy`: for every head k and rank r, how often the head's r-th most likely token
is the target's greedy token at that position (what a tree node's acceptance depends on); the
calibrated tree is built from it. `target_drift`: how far a Medusa-2 adapter moved the target,
the held-out loss of the original and the adapted target and the mean KL(original || adapted)
per position, all in float32. Both read `data.heldout_rows`, rows no step trained on.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..architectures.tree_search import calibrated_choices, estimated_acceptance
from ..data.batching import collate
from ..data.capture import target_logits
from .eagle_losses import ahead, real_positions

#: ranks measured per head (a calibrated tree uses at most this many children per node)
RANKS = 10


def heldout_batches(rows, pad_id: int, micro_batch_size: int, device):
    """The held-out rows as collated batches on `device`."""
    for start in range(0, len(rows), micro_batch_size):
        picked = [rows[i] for i in range(start, min(start + micro_batch_size, len(rows)))]
        yield collate(picked, pad_id).to(device)


@torch.no_grad()
def head_rank_accuracy(heads, target, batches, ranks: int = RANKS) -> list[list[float]]:
    """[K][ranks]: share of held-out positions where head k's r-th token is the target's
    argmax for that token (its logits at t + k)."""
    hits = torch.zeros(heads.num_heads, ranks, dtype=torch.float64)
    counts = torch.zeros(heads.num_heads, dtype=torch.float64)
    for batch in batches:
        out = target(**batch.model_inputs(), hidden_indices=[target.num_layers])
        final = out.hidden_states[target.num_layers]
        for k in range(1, heads.num_heads + 1):
            keep = real_positions(batch, k + 1)
            if not keep.any():
                continue
            wanted = target_logits(target, ahead(final, k, keep)).argmax(-1)
            ranked = heads.head_logits(k - 1, final[keep]).topk(ranks, dim=-1).indices
            hits[k - 1] += (ranked == wanted[:, None]).double().sum(0).cpu()
            counts[k - 1] += len(wanted)
    return (hits / counts.clamp(min=1)[:, None]).tolist()


@torch.no_grad()
def target_drift(
    target, original: Callable[[], AbstractContextManager], batches
) -> dict[str, float]:
    """Held-out next-token loss of the original target (inside `original()`, e.g. peft's
    `disable_adapter`) and of the adapted one, and the mean KL(original || adapted) per
    supervised position."""
    sums = {"heldout_loss_original": 0.0, "heldout_loss_adapted": 0.0, "kl_original_adapted": 0.0}
    positions = 0
    for batch in batches:
        keep = real_positions(batch, 1)
        if not keep.any():
            continue
        labels = ahead(batch.input_ids, 1, keep)
        with original():
            before = target(**batch.model_inputs()).logits[keep].float()
        after = target(**batch.model_inputs()).logits[keep].float()
        log_before, log_after = F.log_softmax(before, -1), F.log_softmax(after, -1)
        sums["heldout_loss_original"] += F.nll_loss(log_before, labels, reduction="sum").item()
        sums["heldout_loss_adapted"] += F.nll_loss(log_after, labels, reduction="sum").item()
        kl = (log_before.exp() * (log_before - log_after)).sum().item()
        sums["kl_original_adapted"] += kl
        positions += len(labels)
    return {name: value / max(positions, 1) for name, value in sums.items()}


@dataclass(frozen=True)
class CalibrationConfig:
    """The tree chosen from held-out head accuracies (needs `data.heldout_rows`)."""

    nodes: int = 16  # paths of the calibrated tree
    ranks: int = RANKS  # ranks measured per head

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.ranks < 1:
            raise ValueError("calibration.nodes and calibration.ranks must be >= 1")


def calibration_record(heads, target, batches, config: CalibrationConfig) -> dict:
    """The training record's held-out fields: per-head rank accuracies, top-1/top-5, and the
    calibrated tree with its estimated acceptance length."""
    accuracy = head_rank_accuracy(heads, target, batches, config.ranks)
    choices = calibrated_choices(accuracy, config.nodes)
    return {
        "heldout_rank_accuracy": [[round(a, 5) for a in row] for row in accuracy],
        "heldout_top1_accuracy": [round(row[0], 5) for row in accuracy],
        "heldout_top5_accuracy": [round(sum(row[:5]), 5) for row in accuracy],
        "calibrated_tree": {
            "choices": [list(path) for path in sorted(choices, key=lambda p: (len(p), p))],
            "estimated_acceptance_length": round(estimated_acceptance(choices, accuracy), 4),
        },
    }
