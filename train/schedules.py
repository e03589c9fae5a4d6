"""Learning-rate multipliers for `torch.optim.lr_scheduler.LambdaLR`."""

from __future__ import annotations

import math
from collections.abc import Callable


def lr_lambda(kind: str, warmup: int, total: int, floor: float) -> Callable[[int], float]:
    """Linear warm-up, then "cosine" or "linear" decay to `floor` x peak, or "constant"."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if kind == "linear":
            return 1.0 - (1.0 - floor) * progress
        if kind == "cosine":
            return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
        raise ValueError(f"unknown schedule {kind!r}")

    return factor
