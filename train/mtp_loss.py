"""MTP's part of the shared loop: the depth-unrolled loss of one micro-batch.

Index conventions (as EAGLE's): depth k (0-based) at position t reads x_{t+k+1} and predicts
x_{t+k+2}, whose target distribution is the target's at t + k + 1; the position counts when
x_{t+k+2} is supervised and in t's packed sample. The step's loss is (lambda / D) x sum_k
L_k, each L_k summed over its positions and the step normalised by the depth-1 count (the
shared loop's convention). L_k: cross-entropy on x_{t+k+2} (`ce`, DeepSeek-V3's objective) or
soft cross-entropy against the target's distribution (`distill`). Accuracy is top-1 agreement
with the target's argmax, what greedy acceptance needs.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from ..architectures.acceptance_length import simulated_acceptance_length
from ..data.capture import head_output, target_logits
from .chunked_loss import rowwise
from .eagle_losses import ahead, attention_allowed, real_positions, soft_ce


class MtpLoss:
    """The shared loop's view of MTP (`blocks.FamilyLoss`)."""

    shown: ClassVar[dict[str, str]] = {"train/acc_0": "acc1"}

    def __init__(self, config, target, features, chunk: int | None = None) -> None:
        self.config, self.target, self.features = config, target, features
        self.chunk = chunk  # rows projected to the vocabulary at once

    def supervised(self, batch) -> torch.Tensor:
        return real_positions(batch, 2).sum()

    def teacher(self, batch):
        """The target's final post-norm states (HF index N)."""
        return self.features(batch)

    def __call__(self, drafter, batch, states, logs: bool = True):
        config = self.config
        final = states[self.target.num_layers]
        select = [real_positions(batch, 2 + k) for k in range(config.depth)]
        outputs = drafter(
            batch.input_ids, final, batch.position_ids, attention_allowed(batch), select
        )
        total = torch.zeros((), device=final.device)
        stats = {}
        for k, (hidden, keep) in enumerate(zip(outputs, select, strict=True)):
            rows = (hidden, ahead(final, 1 + k, keep), ahead(batch.input_ids, 2 + k, keep))
            losses, agree = rowwise(self._row_loss, rows, self.chunk)
            total = total + losses.sum()
            count = keep.sum().float()
            stats[f"acc_{k}"] = torch.stack([agree.sum().float(), count])
            stats[f"loss_{k}"] = torch.stack([losses.detach().sum(), count])
        return total * (config.loss_weight / config.depth), stats

    def _row_loss(self, hidden, final, labels) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, agreement with the target's argmax) per position; the modules share the
        target's head, so their logits are its output over their states (as they draft)."""
        logits = head_output(self.target, hidden).float()
        with torch.no_grad():
            teacher = target_logits(self.target, final)
            agree = logits.argmax(-1) == teacher.argmax(-1)
        if self.config.loss == "distill":
            return soft_ce(logits, torch.softmax(teacher, dim=-1)), agree
        return F.cross_entropy(logits.float(), labels, reduction="none"), agree

    def accuracies(self, metrics: dict[str, float]) -> list[float]:
        """Each depth's top-1 agreement with the target (NaN before the first log)."""
        return [metrics.get(f"train/acc_{k}", float("nan")) for k in range(self.config.depth)]

    def derived(self, metrics: dict[str, float]) -> dict[str, float]:
        accuracies = self.accuracies(metrics)
        return {"train/simulated_acceptance_length": simulated_acceptance_length(accuracies)}

    def begin_step(self, step: int) -> None:
        """Nothing in this loss follows the step."""
