"""Learning-rate multipliers for `torch.optim.lr_scheduler.LambdaLR`."""

from __future__ import annotations

import math
from collections.abc import Callable


def decay_start(total: int, decay_fraction: float) -> int:
    """The step where "wsd" leaves its stable phase: the last `decay_fraction` of `total`
    steps decay. A run of any budget branched from a longer "wsd" run's checkpoint at this
    step follows the schedule it would have followed on its own."""
    return total - round(total * decay_fraction)


def lr_lambda(
    kind: str, warmup: int, total: int, floor: float, decay_fraction: float = 0.2
) -> Callable[[int], float]:
    """Linear warm-up, then "cosine" or "linear" decay to `floor` x peak, "constant", or
    "wsd" (warm-up, stable at the peak, then a linear decay to `floor` over the last
    `decay_fraction` of the steps)."""
    stable_until = max(warmup, decay_start(total, decay_fraction))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        if kind == "wsd":
            progress = min(1.0, max(0, step - stable_until) / max(1, total - stable_until))
            return 1.0 - (1.0 - floor) * progress
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if kind == "linear":
            return 1.0 - (1.0 - floor) * progress
        if kind == "cosine":
            return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
        raise ValueError(f"unknown schedule {kind!r}")

    return factor
