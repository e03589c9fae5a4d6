"""Medusa-1's loss: sum_k decay^(k-1) x loss_k over assistant tokens, the target frozen.

Head k (1..K) reads the target's final post-norm state f_t and predicts x_{t+k+1}; position t
counts for head k when x_{t+k+1} is supervised and in t's packed sample. loss_k is the
cross-entropy on the data's token (`target: data`) or the soft cross-entropy against the
target's own distribution for that token, its logits at position t + k (`target: distill`).
Every head is also scored against the target's argmax for its token (what greedy acceptance
compares): top-1 and top-5 accuracy, logged per head. The loop normalises by head 1's
positions (as EAGLE's first step), so the weights keep their meaning as more heads are added.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..architectures.acceptance_length import simulated_acceptance_length
from ..data.capture import target_head_logits
from .chunked_loss import rowwise
from .eagle_losses import ahead, real_positions
from .teacher_reads import read_positions, read_teacher, read_teacher_once

HEAD_TARGETS = ("data", "distill")


@dataclass(frozen=True)
class MedusaLossConfig:
    """What the heads learn from."""

    target: str = "data"  # "data": the data's tokens (CE); "distill": the target's distribution
    decay: float = 0.8  # head k's weight is decay^(k-1)

    def __post_init__(self) -> None:
        if self.target not in HEAD_TARGETS:
            raise ValueError(f"loss.target must be one of {HEAD_TARGETS}, got {self.target!r}")
        if not 0 < self.decay <= 1:
            raise ValueError("loss.decay must be in (0, 1]")


def head_loss(kind: str, logits: torch.Tensor, data_tokens, teacher_logits) -> torch.Tensor:
    """One head's loss per position: cross-entropy on the data's token (`data`) or soft
    cross-entropy against the teacher's distribution (`distill`)."""
    if kind == "data":
        return F.cross_entropy(logits, data_tokens, reduction="none")
    return -(F.softmax(teacher_logits, -1) * F.log_softmax(logits, -1)).sum(-1)


def draft_head_loss(kind, heads, logits, data_tokens, teacher_logits, wanted) -> torch.Tensor:
    """`head_loss` of draft-vocabulary logits [n, V'] per position (`heads`: the bare
    `MedusaHeads`), against the teacher's logits on the whole vocabulary."""
    kept = teacher_logits if heads.token_map is None else teacher_logits[:, heads.token_map]
    return kept_head_loss(kind, heads, logits, data_tokens, kept, wanted)


def kept_head_loss(kind, heads, logits, data_tokens, kept_teacher, wanted) -> torch.Tensor:
    """`draft_head_loss` with the teacher's logits already on the draft vocabulary
    (`kept_teacher`; unread for `data`).

    Truncated heads, as EAGLE-3's pruned vocabulary: only positions whose token (the data's
    for `data`, the target's greedy one for `distill`) the draft vocabulary holds count (the
    others are 0), and the teacher's distribution is renormalised over the draft vocabulary."""
    draft_ids = heads.draft_ids()
    if draft_ids is None:
        return head_loss(kind, logits, data_tokens, kept_teacher)
    keep = draft_ids[data_tokens if kind == "data" else wanted] >= 0
    losses = head_loss(kind, logits, draft_ids[data_tokens].clamp(min=0), kept_teacher)
    return torch.where(keep, losses, torch.zeros_like(losses))


@torch.no_grad()
def head_hit_rows(
    logits: torch.Tensor, wanted: torch.Tensor, token_map: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-1, top-5) [n] bool: a head's logits against the verifier's greedy tokens `wanted`
    (`token_map`: the target ids of truncated logits)."""
    top5 = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
    if token_map is not None:
        top5 = token_map[top5]
    return top5[:, 0] == wanted, (top5 == wanted[:, None]).any(-1)


def head_hits(k: int, top1: torch.Tensor, top5: torch.Tensor) -> dict[str, torch.Tensor]:
    """{"head{k}_top1": [hits, positions], "head{k}_top5": ...} from `head_hit_rows`."""
    count = torch.tensor(float(len(top1)), device=top1.device)
    return {
        f"head{k}_top1": torch.stack([top1.float().sum(), count]),
        f"head{k}_top5": torch.stack([top5.float().sum(), count]),
    }


class HeadAccuracies:
    """Per-head accuracies from the logged metrics, shared by the Medusa losses."""

    num_heads: int

    def accuracies(self, metrics: dict[str, float], top: int = 1) -> list[float]:
        """Each head's top-1 (or top-5) accuracy against its verifier's argmax (NaN before a
        log)."""
        heads = range(1, self.num_heads + 1)
        return [metrics.get(f"train/head{k}_top{top}", float("nan")) for k in heads]

    def derived(self, metrics: dict[str, float]) -> dict[str, float]:
        accuracies = self.accuracies(metrics)
        return {"train/simulated_acceptance_length": simulated_acceptance_length(accuracies)}

    def record(self, metrics: dict[str, float]) -> dict:
        """The training record's per-head fields."""
        return {
            "head_top1_accuracy": self.accuracies(metrics),
            "head_top5_accuracy": self.accuracies(metrics, top=5),
            **{k.removeprefix("train/"): v for k, v in self.derived(metrics).items()},
        }


def medusa_loss_sums(
    config: MedusaLossConfig, heads, target, final: torch.Tensor, batch, chunk: int | None = None
):
    """(summed weighted loss, {stat: [sum, count]}) of one micro-batch.

    `heads` is the (possibly DDP/DeepSpeed-wrapped) module, called once with every head's
    positions; `final` the target's final post-norm states [b, s, h]; `chunk`: rows projected
    to the vocabulary at once."""
    bare = getattr(heads, "module", heads)
    num_heads = bare.num_heads
    keeps = [real_positions(batch, k + 1) for k in range(1, num_heads + 1)]  # x_{t+k+1} real
    outputs = heads([final[keep] for keep in keeps])
    head_k = _head_rows_of(config.target, bare, target, final, batch, chunk, keeps)
    total = final.new_zeros((), dtype=torch.float32)
    stats: dict[str, torch.Tensor] = {}
    for k, (keep, states) in enumerate(zip(keeps, outputs, strict=True), start=1):
        if not keep.any():  # still in the graph, so data-parallel ranks agree on what trained
            total = total + 0.0 * bare.project(k - 1, states).sum()
            zero = total.new_zeros(2)
            stats.update({f"head{k}_top1": zero, f"head{k}_top5": zero.clone()})
            continue
        losses, top1, top5 = head_k(k, states, keep)
        total = total + config.decay ** (k - 1) * losses.sum()
        stats.update(head_hits(k, top1, top5))
    return total, stats


def _head_rows_of(kind: str, heads, target, final, batch, chunk: int | None, keeps):
    """`(k, states, keep) -> (loss, top-1 hit, top-5 hit)` per position of head k (1-based),
    the verifier read once for every head, at the positions the heads read (`keeps`, head k's
    at t + k), where that costs no more memory than a chunk (`teacher_reads`): its argmax, and
    for `distill` its logits on the draft vocabulary."""
    teacher_head = partial(target_head_logits, target)
    kept = heads.token_map if kind == "distill" else final.new_zeros(0, dtype=torch.long)
    read = read_positions(keeps)
    once = read_teacher_once(teacher_head, final, kept, False, chunk, heads.vocab_size, read)

    def rows_from_final(k: int, h, f, y):
        wanted, teacher, _ = read_teacher(teacher_head, f, kept, False)
        return head_rows(kind, heads, k, h, wanted, teacher, y)

    def head_k(k: int, states, keep):
        tokens = ahead(batch.input_ids, k + 1, keep)
        if once is None:  # each head projects its own rows
            rows = (states, ahead(final, k, keep), tokens)
            return rowwise(partial(rows_from_final, k - 1), rows, chunk)
        rows = (states, ahead(once.wanted, k, keep), ahead(once.logits, k, keep), tokens)
        return rowwise(partial(head_rows, kind, heads, k - 1), rows, chunk)

    return head_k


def head_rows(kind, heads, k: int, states, wanted, kept_teacher, data_tokens):
    """(loss, top-1 hit, top-5 hit) per position of head k (0-based) from its block outputs
    `states`, against the verifier's argmax `wanted` and its logits on the draft vocabulary
    `kept_teacher` (no gradient) and the data's tokens."""
    logits = heads.project(k, states).float()
    top1, top5 = head_hit_rows(logits, wanted, heads.token_map)
    return kept_head_loss(kind, heads, logits, data_tokens, kept_teacher, wanted), top1, top5


class MedusaLoss(HeadAccuracies):
    """The shared loop's view of Medusa-1: the target's final state in, K head losses out."""

    shown: ClassVar[dict[str, str]] = {"train/head1_top1": "head1", "train/head2_top1": "head2"}

    def __init__(
        self, config: MedusaLossConfig, num_heads: int, target, features, chunk: int | None = None
    ) -> None:
        self.config, self.num_heads = config, num_heads
        self.target, self.features, self.chunk = target, features, chunk

    def supervised(self, batch) -> torch.Tensor:
        return real_positions(batch, 2).sum()

    def teacher(self, batch):
        """The target's final post-norm states of `batch`."""
        return self.features(batch)[self.target.num_layers]

    def __call__(self, heads, batch, final, logs: bool = True):
        return medusa_loss_sums(self.config, heads, self.target, final, batch, self.chunk)

    def begin_step(self, step: int) -> None:
        """Nothing in this loss follows the step."""
