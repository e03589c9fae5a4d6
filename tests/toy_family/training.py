"""Train the bigram drafter on the shared blocks: setup -> train -> save."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from draftzoo.data.capture import CaptureConfig
from draftzoo.data.token_dataset import DataConfig
from draftzoo.train.blocks import all_weights, export_drafter, prepare_model, start_run, train_steps
from draftzoo.train.distributed import whole_weights
from draftzoo.train.eagle_losses import ahead, real_positions
from draftzoo.train.recipe_config import TargetSpec, TrainConfig, TrainResult

from .architecture import FAMILY, BigramConfig, build_bigram


@dataclass(frozen=True)
class BigramRecipe:
    """A whole bigram recipe."""

    family: str = FAMILY
    name: str = FAMILY
    output_dir: str = "runs/toy-bigram"
    work_dir: str | None = None
    cache_dir: str | None = None
    target: TargetSpec = field(default_factory=TargetSpec)
    data: DataConfig = field(default_factory=DataConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    bigram: BigramConfig = field(default_factory=BigramConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def capture_layers(self, num_target_layers: int) -> list[int]:
        return []  # reads no target states


class BigramLoss:
    """Cross-entropy of x_{t+1} from x_t over supervised tokens."""

    shown: ClassVar[dict[str, str]] = {"train/top1": "top1"}

    def supervised(self, batch) -> torch.Tensor:
        return real_positions(batch, 1).sum()

    def teacher(self, batch):
        return None

    def __call__(self, model, batch, teacher, logs: bool = True):
        keep = real_positions(batch, 1)
        logits = model(batch.input_ids[keep]).float()
        wanted = ahead(batch.input_ids, 1, keep)
        hits = (logits.argmax(-1) == wanted).float().sum()
        count = logits.new_tensor(float(len(wanted)))
        return F.cross_entropy(logits, wanted, reduction="sum"), {
            "top1": torch.stack([hits, count])
        }

    def derived(self, metrics: dict[str, float]) -> dict[str, float]:
        return {}

    def begin_step(self, step: int) -> None:
        """Nothing follows the step."""


def check_recipe(recipe: BigramRecipe) -> dict:
    return {"family": recipe.family}


def run(recipe: BigramRecipe) -> TrainResult:
    run = start_run(recipe)
    with whole_weights(run.accelerator):
        drafter = build_bigram(recipe.bigram, run.target.model.config.vocab_size)
    drafter = drafter.to(run.accelerator.device)
    drafter, optimizer, scheduler = prepare_model(run.accelerator, drafter, recipe.train)
    outcome = train_steps(run, drafter, optimizer, scheduler, BigramLoss())
    export_drafter(run, drafter, recipe.family, all_weights, {}, outcome)
    return TrainResult.of(run.output_dir, outcome, outcome.metrics.get("train/top1", 0.0))
