"""The draft LM's loss: distillation from the target's logits, or the data's own next tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..data.capture import target_logits
from .chunked_loss import rowwise
from .losses import DISTILL_LOSSES, distill_loss, top1_agreement, total_variation


@dataclass(frozen=True)
class DistillConfig:
    """What the draft LM learns from."""

    #: "fkl", "tvd", "lk" (-log acceptance), "jsd" (against the target's logits) or "ce" (labels)
    loss: str = "fkl"
    temperature: float = 1.0  # softens both distributions for fkl / tvd / jsd

    def __post_init__(self) -> None:
        if self.loss not in DISTILL_LOSSES:
            raise ValueError(f"distill.loss must be one of {DISTILL_LOSSES}, got {self.loss!r}")
        if self.temperature <= 0:
            raise ValueError("distill.temperature must be > 0")


class DraftLMLoss:
    """Summed distillation loss, top-1 agreement and 1 - TVD over supervised positions."""

    shown: ClassVar[dict[str, str]] = {"train/top1_agreement": "top1"}

    def __init__(self, config: DistillConfig, target, features, chunk: int | None = None) -> None:
        self.config, self.target, self.features = config, target, features
        self.chunk = chunk  # rows projected to the vocabulary at once

    def supervised(self, batch) -> torch.Tensor:
        return batch.supervised_targets().sum()

    def teacher(self, batch):
        """The target's states for `batch` (none for `loss: ce`)."""
        return None if self.config.loss == "ce" else self.features(batch)

    def __call__(self, draft, batch, states, logs: bool = True):
        keep = batch.supervised_targets()  # [b, s-1]
        labels = batch.input_ids[:, 1:][keep]
        # the draft model's final states, no logits: its head runs a chunk of rows at a time
        no_logits = torch.zeros(0, dtype=torch.long, device=labels.device)
        out = draft(**batch.model_inputs(), output_hidden_states=True, logits_to_keep=no_logits)
        hidden = out.hidden_states[-1][:, :-1][keep]
        head = getattr(draft, "module", draft).get_output_embeddings()
        count = keep.sum().float()
        if self.config.loss == "ce":
            final = hidden.new_zeros(len(labels), 0)  # no teacher
        else:
            final = states[self.target.num_layers][:, :-1][keep]
        loss, agree, alpha = rowwise(
            lambda h, f, y: self._row_loss(head(h), f, y), (hidden, final, labels), self.chunk
        )
        alpha = alpha.sum() if self.config.loss != "ce" else alpha.new_tensor(float("nan"))
        stats = {
            "top1_agreement": torch.stack([agree.sum().to(count), count]),
            "alpha": torch.stack([alpha.to(count), count]),
        }
        return loss.sum(), stats

    def _row_loss(self, draft_logits, final, labels) -> tuple[torch.Tensor, ...]:
        """(loss, agreement, 1 - TVD) per position: against the data's token for `ce` (the
        last is NaN), else against the target's distribution."""
        if self.config.loss == "ce":
            loss = distill_loss("ce", draft_logits, None, labels)
            with torch.no_grad():
                agree = (draft_logits.argmax(-1) == labels).float()
            return loss, agree, torch.full_like(agree, float("nan"))
        with torch.no_grad():
            teacher = target_logits(self.target, final)
        loss = distill_loss(
            self.config.loss, draft_logits, teacher, labels, self.config.temperature
        )
        with torch.no_grad():
            agree = top1_agreement(draft_logits, teacher)
            alpha = 1.0 - total_variation(draft_logits, teacher)
        return loss, agree, alpha

    def derived(self, metrics: dict[str, float]) -> dict[str, float]:
        return {}

    def begin_step(self, step: int) -> None:
        """Nothing in this loss follows the step."""
