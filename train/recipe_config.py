"""Typed sections shared by drafter recipes (`recipes/<family>/*.yaml`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..architectures.config_io import check_seed
from .precision import PRECISIONS

SCHEDULES = ("cosine", "linear", "constant", "wsd")


@dataclass(frozen=True)
class TargetSpec:
    """The target a drafter is trained for."""

    path: str = "testbed-small"  # a folder, a hub name, or "testbed-small" (the committed one)
    dtype: str = "float32"  # weights dtype of the frozen target: float32, bfloat16, float16


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation loop (launch topology lives in recipes/launch/, not here)."""

    seed: int = 0  # seeds the drafter's weights and the data order
    micro_batch_size: int = 8  # rows per process per forward
    grad_accum: int = 1  # micro-batches per optimizer step
    max_steps: int = 100  # optimizer steps
    lr: float = 1e-3  # peak learning rate (AdamW)
    #: "cosine", "linear" (to min_lr_ratio), "constant", or "wsd": warm-up, stable, then a
    #: linear decay over the last `decay_fraction` of the steps (a shorter budget branches from
    #: a longer run's checkpoint with `start_from`: bench/smollm2_sharegpt.sh's scaling curve)
    schedule: str = "cosine"
    warmup_steps: int = 10  # linear warm-up steps
    min_lr_ratio: float = 0.1  # floor of the decay as a share of lr
    decay_fraction: float = 0.2  # "wsd": the share of max_steps that decays
    weight_decay: float = 0.0  # AdamW decoupled weight decay (matrices only)
    beta2: float = 0.95  # AdamW beta2
    grad_clip: float = 1.0  # max gradient norm
    #: "auto" (bf16 autocast where the hardware has native bf16, else float32), "bf16", "fp16"
    #: or "no"
    mixed_precision: str = "auto"
    #: train on the first N training rows only (more passes over less text at one budget;
    #: the data, its hash and an offline capture stay the whole set's); None: every row
    rows: int | None = None
    checkpoint_every: int = 50  # steps between `save_state` checkpoints (resume points)
    keep_checkpoints: int = 2  # complete checkpoints kept on disk
    #: steps saved as checkpoints besides every `checkpoint_every`, never pruned (branch points)
    checkpoint_steps: tuple[int, ...] = ()
    #: a complete checkpoint of another run (`<work dir>/checkpoints/step-N`) this run starts
    #: from when it has none of its own: weights, optimizer, step, tokens and data position
    start_from: str | None = None
    log_every: int = 10  # steps between logged metrics
    #: rows whose vocabulary-sized logits exist at once in the loss (None: every row of the
    #: micro-batch); smaller chunks lower peak memory, the values stay the same, and a chunked
    #: micro-batch recomputes its projections in the backward pass (EAGLE-3 on SmolLM2, 2,048
    #: rows in chunks of 1,024: +53 % step time), so the default leaves 4,096 rows whole
    loss_chunk_rows: int | None = 4096
    log_with: tuple[str, ...] = ()  # Accelerate trackers: "tensorboard", "wandb" (offline default)
    project: str = "draftzoo"  # tracker project name

    def __post_init__(self) -> None:
        check_seed(self.seed, "train.seed")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.mixed_precision not in PRECISIONS:
            raise ValueError(
                f"mixed_precision must be one of {PRECISIONS}, got {self.mixed_precision!r}"
            )
        if min(self.micro_batch_size, self.grad_accum, self.max_steps, self.checkpoint_every) < 1:
            raise ValueError("batch sizes, max_steps and checkpoint_every must be >= 1")
        if self.warmup_steps >= self.max_steps:
            raise ValueError("warmup_steps must be < max_steps")
        unknown = sorted(set(self.log_with) - {"tensorboard", "wandb"})
        if unknown:
            raise ValueError(f"unknown tracker(s) {unknown} in log_with; known: tensorboard, wandb")
        if self.loss_chunk_rows is not None and self.loss_chunk_rows < 1:
            raise ValueError(
                f"loss_chunk_rows must be >= 1 (or null for no chunks), got {self.loss_chunk_rows}"
            )
        if self.keep_checkpoints < 1:
            raise ValueError("keep_checkpoints must be >= 1")
        if self.rows is not None and self.rows < 1:
            raise ValueError(f"rows must be >= 1 (or null for every row), got {self.rows}")
        if not 0 < self.decay_fraction <= 1:
            raise ValueError(f"decay_fraction must be in (0, 1], got {self.decay_fraction}")
        outside = [s for s in self.checkpoint_steps if not 0 < s < self.max_steps]
        if outside:
            raise ValueError(f"checkpoint_steps must lie in 1..max_steps - 1, got {outside}")
        if not (math.isfinite(self.lr) and self.lr >= 0):
            raise ValueError(f"lr must be a finite number >= 0, got {self.lr}")


@dataclass(frozen=True)
class TrainResult:
    """What a finished run measured."""

    output_dir: Path
    steps: int
    supervised_tokens: int
    final_loss: float
    top1_agreement: float
    train_seconds: float
    resumed_from: int
    data_passes: float

    @classmethod
    def of(cls, output_dir: Path, outcome, top1_agreement: float) -> TrainResult:
        """The result of a finished `blocks.train_steps` run."""
        progress = outcome.progress
        return cls(
            output_dir,
            progress.step,
            progress.supervised_tokens,
            outcome.metrics.get("train/loss", float("nan")),
            top1_agreement,
            progress.train_seconds,
            outcome.resumed_from,
            outcome.data_passes,
        )
