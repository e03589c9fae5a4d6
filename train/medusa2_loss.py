"""Medusa-2's loss: heads and a LoRA on the target trained together, the target kept itself.

    loss = distill_weight x KL(original || adapted)  +  lambda(step) x sum_k decay^(k-1) loss_k

The first term is self-distillation: the adapted target's next-token distribution against the
same model with its adapter disabled (computed outside autocast, no gradient), over the
supervised positions, so the LoRA may reshape the hidden states the heads read but not what
the target says. loss_k is head k's loss on its token, as in Medusa-1 (`data`: the data's
token; `distill`: the original target's distribution for that token). lambda rises from 0 to
`heads_weight` over `ramp_steps` (sine, linear, or constant), so the heads' early, large
gradients do not pull the adapter away while they are still random. Per-head accuracies are
scored against the *adapted* target's argmax: the target the heads will be verified by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from .chunked_loss import rowwise
from .eagle_losses import ahead, real_positions
from .medusa_loss import HEAD_TARGETS, HeadAccuracies, draft_head_loss, head_hit_rows, head_hits

RAMPS = ("sine", "linear", "constant")


@dataclass(frozen=True)
class Medusa2LossConfig:
    """What the heads and the adapter learn from."""

    target: str = "distill"  # heads: "distill" (the original target's distribution) or "data"
    decay: float = 0.8  # head k's weight is decay^(k-1)
    heads_weight: float = 0.2  # lambda once ramped in (Medusa's heads coefficient)
    heads_ramp: str = "sine"  # how lambda rises from 0: "sine", "linear" or "constant" (none)
    ramp_steps: int = 400  # steps until lambda reaches heads_weight
    distill_weight: float = 1.0  # weight of KL(original || adapted)

    def __post_init__(self) -> None:
        if self.target not in HEAD_TARGETS:
            raise ValueError(f"loss.target must be one of {HEAD_TARGETS}, got {self.target!r}")
        if self.heads_ramp not in RAMPS:
            raise ValueError(f"loss.heads_ramp must be one of {RAMPS}, got {self.heads_ramp!r}")
        if not 0 < self.decay <= 1 or self.heads_weight <= 0 or self.distill_weight < 0:
            raise ValueError("loss.decay must be in (0, 1], heads_weight > 0, distill_weight >= 0")
        if self.ramp_steps < 0:
            raise ValueError("loss.ramp_steps must be >= 0")

    def heads_weight_at(self, step: int) -> float:
        """lambda at optimizer step `step` (0-based)."""
        if self.heads_ramp == "constant" or step >= self.ramp_steps:
            return self.heads_weight
        share = step / self.ramp_steps
        rise = math.sin(math.pi / 2 * share) if self.heads_ramp == "sine" else share
        return self.heads_weight * rise


class Medusa2Loss(HeadAccuracies):
    """The shared loop's view of Medusa-2 (the model is `AdaptedTargetHeads`)."""

    shown: ClassVar[dict[str, str]] = {"train/kl": "kl", "train/head1_top1": "head1"}

    def __init__(self, config: Medusa2LossConfig, model, chunk: int | None = None) -> None:
        self.config, self.model = config, model  # the bare module, for the teacher forward
        self.num_heads = model.heads.num_heads
        self.weight = config.heads_weight_at(0)
        self.chunk = chunk  # rows projected to the vocabulary at once

    def begin_step(self, step: int) -> None:
        self.weight = self.config.heads_weight_at(step)

    def supervised(self, batch) -> torch.Tensor:
        return real_positions(batch, 2).sum()

    @torch.no_grad()
    def teacher(self, batch) -> torch.Tensor:
        """The original target's final post-norm states [b, s, h] (adapter disabled)."""
        with self.model.original():
            return self.model.final_states(batch.model_inputs())

    @torch.no_grad()
    def _original_logits(self, original: torch.Tensor) -> torch.Tensor:
        """The original target's logits [n, V] from its final states (adapter disabled)."""
        with self.model.original():
            return self.model.target.lm_head(original).float()

    def _kl_rows(self, adapted, original) -> tuple[torch.Tensor]:
        log_q = F.log_softmax(self.model.target.lm_head(adapted).float(), -1)
        log_p = F.log_softmax(self._original_logits(original), -1)
        return ((log_p.exp() * (log_p - log_q)).sum(-1),)

    def _head_rows(self, k: int, states, adapted, original, data_tokens):
        """Head k's (0-based) loss, top-1 and top-5 hits per position: scored against the
        adapted target's argmax, taught by the original target's distribution."""
        heads = self.model.heads
        logits = heads.project(k, states).float()
        with torch.no_grad():
            wanted = self.model.target.lm_head(adapted).argmax(-1)
        teacher = self._original_logits(original)
        top1, top5 = head_hit_rows(logits, wanted, heads.token_map)
        loss = draft_head_loss(self.config.target, heads, logits, data_tokens, teacher, wanted)
        return loss, top1, top5

    def __call__(self, model, batch, teacher: torch.Tensor, logs: bool = True):
        keeps = [real_positions(batch, k + 1) for k in range(1, self.num_heads + 1)]
        final, outputs = model(batch.model_inputs(), keeps)
        here = real_positions(batch, 1)
        (kl,) = rowwise(self._kl_rows, (final[here], teacher[here]), self.chunk)
        kl = kl.sum()
        heads = final.new_zeros((), dtype=torch.float32)
        stats = {"kl": torch.stack([kl.detach(), here.sum().float()])}
        for k, (keep, states) in enumerate(zip(keeps, outputs, strict=True), start=1):
            rows = (
                states,
                ahead(final, k, keep).detach(),
                ahead(teacher, k, keep),
                ahead(batch.input_ids, k + 1, keep),
            )
            losses, top1, top5 = rowwise(
                lambda *r, k=k: self._head_rows(k - 1, *r), rows, self.chunk
            )
            heads = heads + self.config.decay ** (k - 1) * losses.sum()
            stats.update(head_hits(k, top1, top5))
        stats["heads_weight"] = torch.stack([heads.new_tensor(self.weight), heads.new_tensor(1.0)])
        total = self.config.distill_weight * kl + self.weight * heads
        return total, stats
