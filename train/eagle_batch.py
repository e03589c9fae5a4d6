"""EAGLE's part of the shared loop: one micro-batch's loss and statistics."""

from __future__ import annotations

from functools import partial
from typing import ClassVar

import torch

from ..architectures.acceptance_length import simulated_acceptance_length
from ..data.capture import target_head_logits
from ..data.repeats import repeated_bigrams
from .eagle_losses import (
    ahead,
    attention_allowed,
    eagle1_loss_sums,
    eagle3_loss_sums,
    noisy,
    real_positions,
)


def eagle_loss_sums(config, drafter, module, target, states, batch, split_repeats=True, chunk=None):
    """Summed loss and stats {name: [sum, count]} for one micro-batch. `config` is the recipe's
    `EagleConfig`, `drafter` the (possibly DDP/DeepSpeed-wrapped) model to call, `module` the
    bare drafter; `split_repeats` adds the first step's repeated/fresh accuracy (only logged
    steps need it); `chunk`: rows projected to the vocabulary at once."""
    final = states[target.num_layers]
    teacher_head = partial(target_head_logits, target)
    clean = torch.cat([states[layer] for layer in module.layers], dim=-1)
    clean = clean.to(module.fc.weight.dtype)
    fused = noisy(clean, config.feature_noise, drafter.training)
    select = [real_positions(batch, 2 + j) for j in range(config.ttt_steps)]
    allowed = attention_allowed(batch)
    outputs = drafter(batch.input_ids, fused, batch.position_ids, allowed, select)
    repeated = None
    if split_repeats:
        repeated = ahead(repeated_bigrams(batch.input_ids, batch.position_ids), 2, select[0])
    if config.kind == "eagle1":
        return eagle1_loss_sums(
            outputs,
            select[0],
            final,
            module.logits,
            teacher_head,
            config.token_loss,
            repeated,
            chunk,
        )
    g0 = None
    if config.feature_weight:
        with torch.no_grad():
            g0 = module.fuse(clean)
    return eagle3_loss_sums(
        outputs,
        select,
        final,
        module.logits,
        teacher_head,
        module.d2t,
        module.t2d,
        config.ttt_decay,
        fused=g0,
        feature_weight=config.feature_weight,
        token_loss=config.token_loss,
        repeated=repeated,
        head_norm=target.final_norm if config.final_feature_weight else None,
        final_feature_weight=config.final_feature_weight,
        chunk=chunk,
        draft_head=_whole_head(module),
    )


def _whole_head(module) -> tuple[torch.nn.Module, torch.Tensor] | None:
    """The EAGLE-3 head's norm and weight for `head_soft_ce`, where the weight is whole on
    this rank (not partitioned by ZeRO-3 or FSDP, whose gathers happen in module calls)."""
    weight = module.lm_head.weight
    if type(weight.data) is not torch.Tensor:  # an FSDP2 DTensor: sharded
        return None
    if weight.shape != (module.draft_vocab_size, module.fields["hidden_size"]):
        return None  # a ZeRO-3 partition
    return module.norm, weight


class EagleLoss:
    """The shared loop's view of EAGLE: positions with a next-but-one token, the TTT loss."""

    shown: ClassVar[dict[str, str]] = {"train/acc_0": "acc0", "train/acc_0_repeated": "repeated"}

    def __init__(self, config, module, target, features, chunk: int | None = None) -> None:
        self.config, self.module, self.target, self.features = config, module, target, features
        self.chunk = chunk  # rows projected to the vocabulary at once

    def supervised(self, batch) -> torch.Tensor:
        return real_positions(batch, 2).sum()

    def teacher(self, batch):
        """The target's states at the drafter's layers and its final one."""
        return self.features(batch)

    def __call__(self, drafter, batch, states, logs: bool = True):
        return eagle_loss_sums(
            self.config, drafter, self.module, self.target, states, batch, logs, self.chunk
        )

    def accuracies(self, metrics: dict[str, float]) -> list[float]:
        """Each training-time-test step's top-1 accuracy (NaN before the first log)."""
        steps = range(self.config.ttt_steps)
        return [metrics.get(f"train/acc_{j}", float("nan")) for j in steps]

    def derived(self, metrics: dict[str, float]) -> dict[str, float]:
        accuracies = self.accuracies(metrics)
        return {"train/simulated_acceptance_length": simulated_acceptance_length(accuracies)}

    def begin_step(self, step: int) -> None:
        """Nothing in this loss follows the step."""
