"""The autocast precision a run trains in: what the recipe asks for, resolved for the hardware.

`mixed_precision: auto` trains in bf16 autocast where the hardware multiplies bf16 natively (a
CUDA device with bf16 support; a CPU with AVX512-BF16 or AMX) and in float32 elsewhere. On a
CPU without them, bf16 matrix products are emulated: on one AMD EPYC (Zen 3) core the
drafter's products took 3-9x longer under bf16 autocast and 40-90x as plain bf16 products
(`bench/precision_bench.py`), and an EAGLE-3 training step 16x longer. An explicit `bf16` is
kept as asked, with a warning saying so.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

#: values of `train.mixed_precision` (recipes and the testbed's pretraining)
PRECISIONS = ("auto", "bf16", "fp16", "no")


def native_bf16(device: torch.device) -> bool:
    """Whether `device` runs bf16 matrix products in hardware."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(getattr(torch.cpu, name, lambda: False)() for name in checks)
    return False


def training_device(cpu: bool) -> torch.device:
    """The device a process trains on: the CPU when `cpu`, else its CUDA device."""
    return torch.device("cpu" if cpu or not torch.cuda.is_available() else "cuda")


def resolve_mixed_precision(requested: str, device: torch.device) -> str:
    """The Accelerate `mixed_precision` for `requested` on `device`: "auto" becomes "bf16"
    where bf16 is native and "no" elsewhere; any other value is returned as asked, and "bf16"
    without native support is logged as the slow choice it is."""
    if requested not in PRECISIONS:
        raise ValueError(f"mixed_precision must be one of {PRECISIONS}, got {requested!r}")
    native = native_bf16(device)
    if requested == "auto":
        resolved = "bf16" if native else "no"
        logger.info(
            "mixed_precision auto -> %s (%s %s native bf16)",
            resolved,
            device.type,
            "with" if native else "without",
        )
        return resolved
    if requested == "bf16" and not native:
        logger.warning(
            "mixed_precision bf16 on a %s without native bf16 (no AVX512-BF16/AMX on a CPU): "
            "its matrix products are emulated and training runs many times slower than in "
            "float32; `mixed_precision: auto` picks float32 here",
            device.type,
        )
    return requested
