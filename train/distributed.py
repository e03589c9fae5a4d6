"""Process-group setup that also distributes on CPU-only machines."""

from __future__ import annotations

import os
from contextlib import contextmanager

from ..architectures.errors import DraftzooError
from .precision import resolve_mixed_precision, training_device


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


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


class LaunchError(DraftzooError, RuntimeError):
    """A launch topology that cannot run on this machine."""


def make_accelerator(micro_batch_size: int, grad_accum: int, grad_clip: float, **kwargs):
    """An `Accelerator` for the topology `accelerate launch` chose, CPU-aware, never downgraded.

    - DeepSpeed (ZeRO-2/3): on a CPU-only machine the process group is formed over gloo first
      (without it Accelerate does not shard data); the recipe's micro-batch, accumulation and
      clipping are written into the DeepSpeed config.
    - FSDP: refused on a CPU-only machine (Accelerate would silently run plain DDP instead).
    - otherwise DDP / single process; on CPU through `cpu=True` so that a gloo group forms.

    `mixed_precision="auto"` is resolved for the device first (`precision.resolve_mixed_precision`).
    """
    import torch
    from accelerate import Accelerator, PartialState
    from accelerate.state import AcceleratorState

    # a second run in the same process (a test, a notebook, the demo) may ask for another
    # precision; the process group (PartialState) is kept
    AcceleratorState._reset_state()
    if "mixed_precision" in kwargs:
        device = training_device(cpu_only())
        kwargs["mixed_precision"] = resolve_mixed_precision(kwargs["mixed_precision"], device)
    if _env_flag("ACCELERATE_USE_FSDP") and not torch.cuda.is_available():
        raise LaunchError(
            "FSDP needs CUDA devices: Accelerate does not activate FSDP on CPU (it would run "
            "unsharded). On CPU use recipes/launch/ddp.yaml or deepspeed-zero2/3.yaml."
        )
    if not _env_flag("ACCELERATE_USE_DEEPSPEED"):
        return Accelerator(cpu=cpu_only(), **kwargs)
    if not torch.cuda.is_available():
        PartialState(backend="gloo")
    accelerator = Accelerator(gradient_accumulation_steps=grad_accum, **kwargs)
    config = accelerator.state.deepspeed_plugin.deepspeed_config
    config["train_micro_batch_size_per_gpu"] = micro_batch_size
    config["gradient_accumulation_steps"] = grad_accum
    config["gradient_clipping"] = grad_clip
    config["train_batch_size"] = micro_batch_size * grad_accum * accelerator.num_processes
    return accelerator


def uses_deepspeed(accelerator) -> bool:
    """True when DeepSpeed's engine steps, clips and accumulates for the loop."""
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.DEEPSPEED


def weights_digest(model) -> str:
    """sha256 over a module's parameters (names, shapes and bytes), in name order."""
    import hashlib

    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        digest.update(name.encode())
        data = param.detach().float().cpu().contiguous()
        digest.update(str(tuple(data.shape)).encode())
        digest.update(data.numpy().tobytes())
    return digest.hexdigest()


def check_replicas(accelerator, model, work_dir) -> bool | None:
    """Refuse to export when data-parallel ranks ended with different weights.

    Each rank's digest is written to `work_dir/replicas.json`. Returns True when all ranks
    agree, None where parameters are sharded (ZeRO-3), so no rank holds them whole.
    """
    import json
    from pathlib import Path

    from accelerate.utils import gather_object

    from ..architectures.output_folders import write_text_atomically

    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None and plugin.zero_stage == 3:
        return None
    digests = gather_object([weights_digest(accelerator.unwrap_model(model))])
    if accelerator.is_main_process:
        write_text_atomically(Path(work_dir, "replicas.json"), json.dumps({"digests": digests}))
    if len(set(digests)) != 1:
        raise LaunchError(f"data-parallel ranks hold different weights: {digests}")
    return True


@contextmanager
def whole_weights(accelerator):
    """Build models with whole (not ZeRO-3-partitioned) weights inside this context.

    Under ZeRO-3 transformers partitions every model it loads while a DeepSpeed config is
    registered. The frozen target is never handed to `prepare`, so it must load whole; the
    drafter is partitioned by `prepare` itself. The registration is restored on exit.
    """
    if getattr(accelerator.state, "deepspeed_plugin", None) is None:
        yield
        return
    from transformers.integrations import deepspeed as hf_deepspeed

    saved = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = saved
