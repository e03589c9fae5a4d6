"""Process-group setup that also distributes on CPU-only machines."""

from __future__ import annotations

import os


def cpu_only() -> bool:
    """True when training must run on CPU: no CUDA device, or ACCELERATE_USE_CPU=1.

    Accelerate only forms a multi-process CPU group (gloo) when told `cpu=True`; without it,
    `accelerate launch --multi_gpu --num_processes 2` on a CPU machine starts two processes
    that each train alone on the same data.
    """
    import torch

    flag = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
    return flag or not torch.cuda.is_available()


def partial_state():
    """The shared Accelerate `PartialState`, initialised CPU-aware."""
    from accelerate import PartialState

    return PartialState(cpu=cpu_only())
