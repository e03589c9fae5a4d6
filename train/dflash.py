"""Train a DFlash block drafter for a target, top to bottom: setup -> train -> save.

    accelerate launch [--config_file recipes/launch/<topology>.yaml] -m draftzoo \
        train recipes/dflash/testbed-small.yaml

(or `draftzoo train RECIPE` for one process). The target's states at the drafter's taps (and
its final post-norm state, from which its logits are recomputed) come online or from offline
shards (`draftzoo capture RECIPE`). Each step draws blocks in every row and predicts all of
them in one forward (`dflash_loss.py`). Setup, the loop, checkpoints, exact resume, replica
checks and the atomic export are the shared training blocks (`blocks.py`). Logged: the loss,
each slot's top-1 agreement with the target and the blocks' greedy acceptance length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..architectures.dflash import FAMILY, DflashConfig, build_dflash
from ..data.capture import CaptureConfig
from ..data.token_dataset import DataConfig
from .blocks import export_drafter, own_weights, prepare_model, start_run, train_steps
from .dflash_loss import DflashLoss
from .distributed import whole_weights
from .draft_vocab import truncate_at_export
from .recipe_config import TargetSpec, TrainConfig, TrainResult
from .setup import meta_target, model_config


@dataclass(frozen=True)
class DflashRecipe:
    """A whole DFlash recipe."""

    family: str = FAMILY
    name: str = "dflash"  # run and tracker name
    output_dir: str = "runs/dflash"  # the exported drafter
    work_dir: str | None = None  # checkpoints and logs (default: <output_dir>.work)
    cache_dir: str | None = None  # tokenized data cache (default: $DRAFTZOO_CACHE/data)
    target: TargetSpec = field(default_factory=TargetSpec)
    data: DataConfig = field(default_factory=DataConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    dflash: DflashConfig = field(default_factory=DflashConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if self.family != FAMILY:
            raise ValueError(f"family must be {FAMILY!r}, got {self.family!r}")

    def capture_layers(self, num_target_layers: int) -> list[int]:
        """HF indices the recipe reads from the target: the taps and the final one."""
        return sorted({*self.dflash.resolved_layers(num_target_layers), num_target_layers})


def check_on_meta(recipe: DflashRecipe, target_config) -> dict:
    """Build target and drafter on the meta device and check they fit (no weights)."""
    target = meta_target(target_config, recipe.data.max_length)
    with torch.device("meta"):
        drafter = build_dflash(recipe.dflash, target)
    return {
        "target_parameters": sum(p.numel() for p in target.parameters()),
        "drafter_parameters": sum(p.numel() for p in drafter.parameters()),
        "hidden_state_layers": list(drafter.taps),
        "block_size": drafter.block_size,
        "draft_layers": len(drafter.layers),
        "mask_token_id": drafter.mask_token_id,
        "vocab_size": target.lm_head.weight.shape[0],
        "target_layers": target.num_layers,
    }


def check_recipe(recipe: DflashRecipe) -> dict:
    """`check_on_meta` with the target's config found by name."""
    return check_on_meta(recipe, model_config(recipe.target.path))


def run(recipe: DflashRecipe) -> TrainResult:
    """Train and export the drafter; resumes from the newest complete checkpoint."""
    run = start_run(recipe)
    with whole_weights(run.accelerator):
        drafter = build_dflash(recipe.dflash, run.target)  # refuses missing layers first
    drafter, optimizer, scheduler = prepare_model(
        run.accelerator, drafter.to(run.accelerator.device), recipe.train
    )
    module = run.accelerator.unwrap_model(drafter)
    loss = DflashLoss(
        recipe.dflash,
        module,
        run.target,
        run.features,
        recipe.train.seed,
        recipe.train.loss_chunk_rows,
    )
    outcome = train_steps(run, drafter, optimizer, scheduler, loss)
    accuracies = loss.accuracies(outcome.metrics)
    training = {
        "slot_accuracy": accuracies,
        "block_tau": outcome.metrics.get("train/block_tau", float("nan")),
        "simulated_acceptance_length": loss.derived(outcome.metrics)[
            "train/simulated_acceptance_length"
        ],
    }
    training.update(truncate_at_export(run, module, recipe.dflash))
    export_drafter(run, drafter, FAMILY, own_weights, training, outcome, list(module.taps))
    return TrainResult.of(run.output_dir, outcome, accuracies[0])
