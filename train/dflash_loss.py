"""DFlash's part of the shared loop: blocks drawn in each row, all predicted in one forward.

Anchors: up to `dflash.anchors_per_row` positions a per row, drawn without replacement among
those whose next token x_{a+1} is supervised in a's packed sample and whose sample position is
at least 1 (the runtime always has a context). The draw is seeded by the recipe's seed, the
step and the rows' tokens, so a resumed run draws the same blocks.

Block j is the anchor token at position a_j followed by mask tokens at a_j + 1 .. a_j + B - 1;
its slots see the context entries of their sample before a_j and the whole block (no causal
mask inside it), never another block. Slot i (1..B-1) predicts x_{a_j + i} and counts when that
token is supervised in a_j's sample. Loss per slot: soft cross-entropy against the target's
distribution at a_j + i - 1 (`ce`) or cross-entropy on x_{a_j + i} (`hard`), weighted by
exp(-(i - 1) / loss_decay); the step is normalised by the count of supervised slots (the
shared loop's convention), while the run records as its training tokens the supervised
positions every other family counts (`budget_positions`), so budgets compare. Logged: each
slot's top-1 agreement with the target's argmax and `block_tau`, 1 + the leading agreements of
each block: the greedy acceptance length of the block drafted there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..architectures.acceptance_length import simulated_acceptance_length
from ..data.capture import target_logits
from .chunked_loss import rowwise
from .eagle_losses import real_positions, soft_ce


@dataclass(frozen=True)
class BlockPlan:
    """The blocks of one micro-batch."""

    anchors: torch.Tensor  # [b, A] long: anchor positions (0 where not valid)
    valid: torch.Tensor  # [b, A] bool: a drawn block
    slots: torch.Tensor  # [b, A, B-1] bool: drafted slot i + 1 is supervised


def draw_anchors(batch, count: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """(anchors [b, A], valid [b, A]): up to `count` sorted anchors per row, A the most any
    row drew (at least 1)."""
    eligible = real_positions(batch, 1) & (batch.position_ids >= 1)
    rows = []
    for row in eligible.cpu():
        candidates = torch.nonzero(row, as_tuple=True)[0]
        order = torch.randperm(len(candidates), generator=generator)[:count]
        rows.append(candidates[order].sort().values)
    width = max(1, max(len(r) for r in rows))
    anchors = torch.zeros(len(rows), width, dtype=torch.long)
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        anchors[i, : len(row)], valid[i, : len(row)] = row, True
    device = batch.input_ids.device
    return anchors.to(device), valid.to(device)


def block_plan(batch, block_size: int, count: int, seed: int) -> BlockPlan:
    """Anchors drawn with `seed` and the slots each block supervises."""
    generator = torch.Generator().manual_seed(seed)
    anchors, valid = draw_anchors(batch, count, generator)
    width = batch.input_ids.shape[1]
    slots = []
    for i in range(1, block_size):
        real = real_positions(batch, i)  # x_{t+i} supervised in t's sample
        slots.append(real.gather(1, anchors) & valid & (anchors + i < width))
    return BlockPlan(anchors, valid, torch.stack(slots, dim=-1))


def block_inputs(drafter, batch, anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, positions) [b, A*B] of every block: the anchor token and mask tokens, at the
    anchor's position onwards."""
    b, count = anchors.shape
    ids = drafter.block_inputs(batch.input_ids.gather(1, anchors)).reshape(b, -1)
    offsets = torch.arange(drafter.block_size, device=anchors.device)
    positions = batch.position_ids.gather(1, anchors)[..., None] + offsets
    return ids, positions.reshape(b, count * drafter.block_size)


def block_attention(batch, anchors: torch.Tensor, valid: torch.Tensor, block_size: int):
    """[b, 1, A*B, s + A*B] bool: block j's slots see the context of their sample before
    a_j and all of block j."""
    pos = batch.position_ids
    b, s = pos.shape
    count = anchors.shape[1]
    index = torch.arange(s, device=pos.device)
    before = index[None, None, :] < anchors[..., None]
    # p is in a's sample when the positions between them count up without a restart
    same = pos.gather(1, anchors)[..., None] - pos[:, None, :] == anchors[..., None] - index
    context = (before & same & valid[..., None]).repeat_interleave(block_size, dim=1)
    blocks = torch.eye(count, dtype=torch.bool, device=pos.device)
    blocks = blocks.repeat_interleave(block_size, 0).repeat_interleave(block_size, 1)
    return torch.cat([context, blocks.expand(b, -1, -1)], dim=-1)[:, None]


class DflashLoss:
    """The shared loop's view of DFlash (`blocks.FamilyLoss`)."""

    shown: ClassVar[dict[str, str]] = {"train/acc_1": "acc1", "train/block_tau": "tau"}

    def __init__(
        self, config, module, target, features, seed: int, chunk: int | None = None
    ) -> None:
        self.config, self.module, self.target, self.features = config, module, target, features
        self.seed, self.step, self.chunk = seed, 0, chunk
        self.weights = config.slot_weights()
        self._plans: dict[int, tuple[object, BlockPlan]] = {}

    def begin_step(self, step: int) -> None:
        """Blocks are drawn anew each step."""
        self.step = step
        self._plans.clear()

    def plan(self, batch) -> BlockPlan:
        """The micro-batch's blocks, drawn once (its count and its loss read the same)."""
        held = self._plans.get(id(batch))
        if held is None or held[0] is not batch:
            content = int(batch.input_ids.sum()) * 31 + batch.input_ids.numel()
            seed = hash((self.seed, self.step, content)) % (2**63)
            plan = block_plan(batch, self.config.block_size, self.config.anchors_per_row, seed)
            held = (batch, plan)
            self._plans[id(batch)] = held
        return held[1]

    def supervised(self, batch) -> torch.Tensor:
        return self.plan(batch).slots.sum()

    def budget_positions(self, batch) -> torch.Tensor:
        """Supervised positions as the other families count them (x_{t+2} supervised in t's
        sample), recorded as the run's training tokens instead of the drafted slots."""
        return real_positions(batch, 2).sum()

    def teacher(self, batch):
        """The target's states at the taps and its final one."""
        return self.features(batch)

    def __call__(self, drafter, batch, states, logs: bool = True):
        module, plan = self.module, self.plan(batch)
        fused = torch.cat([states[layer] for layer in module.taps], dim=-1)
        ids, positions = block_inputs(module, batch, plan.anchors)
        mask = block_attention(batch, plan.anchors, plan.valid, module.block_size)
        hidden = drafter(fused, batch.position_ids, ids, positions, mask)
        b, count = plan.anchors.shape
        hidden = hidden.view(b, count, module.block_size, -1)[:, :, 1:]
        keep = plan.slots
        slot = torch.arange(1, module.block_size, device=keep.device).expand_as(keep)
        rows = torch.arange(b, device=keep.device)[:, None, None].expand_as(keep)[keep]
        labels_at = (plan.anchors[..., None] + slot)[keep]
        final = states[self.target.num_layers][rows, labels_at - 1]
        labels = batch.input_ids[rows, labels_at]
        losses, agree = rowwise(self._slot_loss, (hidden[keep], final, labels), self.chunk)
        weights = self.weights.to(losses.device)[slot[keep] - 1]
        return (losses * weights).sum(), self._stats(plan, agree, losses, slot)

    def _slot_loss(self, hidden, final, labels) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, agreement with the target's argmax) of drafted slots, per slot."""
        logits = self.module.logits(hidden).float()
        with torch.no_grad():
            teacher = target_logits(self.target, final)
            agree = logits.argmax(-1) == teacher.argmax(-1)
        if self.config.token_loss == "ce":
            return soft_ce(logits, torch.softmax(teacher, dim=-1)), agree
        return F.cross_entropy(logits, labels, reduction="none"), agree

    def _stats(self, plan: BlockPlan, agree, losses, slot) -> dict[str, torch.Tensor]:
        """Each slot's agreement and loss, and the blocks' greedy acceptance length."""
        keep = plan.slots
        with torch.no_grad():
            hits = torch.zeros_like(keep)
            hits[keep] = agree
            stats = {}
            for i in range(1, self.module.block_size):
                mine = slot[keep] == i
                count = keep[..., i - 1].sum().float()
                stats[f"acc_{i}"] = torch.stack([hits[..., i - 1].sum().float(), count])
                stats[f"loss_{i}"] = torch.stack([losses.detach()[mine].sum(), count])
            leading = hits.long().cumprod(dim=-1).sum(dim=-1)
            tau = (1 + leading)[plan.valid].sum().float()
            stats["block_tau"] = torch.stack([tau, plan.valid.sum().float()])
        return stats

    def accuracies(self, metrics: dict[str, float]) -> list[float]:
        """Each drafted slot's top-1 agreement with the target (NaN before the first log)."""
        slots = range(1, self.config.block_size)
        return [metrics.get(f"train/acc_{i}", float("nan")) for i in slots]

    def derived(self, metrics: dict[str, float]) -> dict[str, float]:
        accuracies = self.accuracies(metrics)
        return {"train/simulated_acceptance_length": simulated_acceptance_length(accuracies)}
