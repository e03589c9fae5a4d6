"""Train MTP modules for a target, top to bottom: setup -> train -> save.

    accelerate launch [--config_file recipes/launch/<topology>.yaml] -m draftzoo \
        train recipes/mtp/testbed-small.yaml

(or `draftzoo train RECIPE` for one process). The modules read the target's final post-norm
state (HF index N), online or from offline shards (`draftzoo capture RECIPE`). `mtp.init_from:
native` starts from the modules the target's own checkpoint ships (`mtp_native.py`);
`scratch` builds new ones. Depth k > 1 trains on depth k - 1's own outputs (`mtp_loss.py`).
Setup, the loop, checkpoints, exact resume, replica checks and the atomic export are the shared
training blocks (`blocks.py`). Logged: the loss, each depth's loss and top-1 agreement with the
target, and the acceptance length those agreements imply for a chain.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from ..architectures.defaults import target_location
from ..architectures.mtp import FAMILY, MtpConfig, MtpDrafter, build_mtp
from ..architectures.mtp_native import load_native_modules
from ..data.capture import CaptureConfig
from ..data.token_dataset import DataConfig
from .blocks import all_weights, export_drafter, prepare_model, start_run, train_steps
from .distributed import whole_weights
from .draft_vocab import truncate_at_export
from .mtp_loss import MtpLoss
from .recipe_config import TargetSpec, TrainConfig, TrainResult
from .setup import meta_target, model_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MtpRecipe:
    """A whole MTP recipe."""

    family: str = FAMILY
    name: str = "mtp"  # run and tracker name
    output_dir: str = "runs/mtp"  # the exported drafter
    work_dir: str | None = None  # checkpoints and logs (default: <output_dir>.work)
    cache_dir: str | None = None  # tokenized data cache (default: $DRAFTZOO_CACHE/data)
    target: TargetSpec = field(default_factory=TargetSpec)
    data: DataConfig = field(default_factory=DataConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    mtp: MtpConfig = field(default_factory=MtpConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if self.family != FAMILY:
            raise ValueError(f"family must be {FAMILY!r}, got {self.family!r}")

    def capture_layers(self, num_target_layers: int) -> list[int]:
        """The target's final post-norm state (HF index N) is all the modules read."""
        return [num_target_layers]


def check_on_meta(recipe: MtpRecipe, target_config) -> dict:
    """Build target and modules on the meta device and check they fit (no weights)."""
    target = meta_target(target_config, recipe.data.max_length)
    with torch.device("meta"):
        drafter = build_mtp(recipe.mtp, target)
    return {
        "target_parameters": sum(p.numel() for p in target.parameters()),
        "drafter_parameters": sum(p.numel() for p in drafter.parameters()),
        "depth": drafter.depth,
        "decoder_layer_class": drafter.fields["decoder_layer_class"],
        "hidden_state_layers": list(drafter.layers_read),
        "vocab_size": target.lm_head.weight.shape[0],
        "target_layers": target.num_layers,
    }


def check_recipe(recipe: MtpRecipe) -> dict:
    """`check_on_meta` with the target's config found by name."""
    return check_on_meta(recipe, model_config(recipe.target.path))


def _build(recipe: MtpRecipe, run) -> MtpDrafter:
    """New modules, or the target checkpoint's own (`init_from: native`)."""
    with whole_weights(run.accelerator):
        drafter = build_mtp(recipe.mtp, run.target)
        if recipe.mtp.init_from == "native":
            layout = load_native_modules(drafter, target_location(recipe.target.path), run.target)
            logger.info("started from the target's native MTP modules (%s layout)", layout)
    return drafter.to(run.accelerator.device)


def run(recipe: MtpRecipe) -> TrainResult:
    """Train and export the modules; resumes from the newest complete checkpoint."""
    run = start_run(recipe)
    drafter, optimizer, scheduler = prepare_model(
        run.accelerator, _build(recipe, run), recipe.train
    )
    loss = MtpLoss(recipe.mtp, run.target, run.features, recipe.train.loss_chunk_rows)
    outcome = train_steps(run, drafter, optimizer, scheduler, loss)
    accuracies = loss.accuracies(outcome.metrics)
    training = {
        "depth_accuracy": accuracies,
        "simulated_acceptance_length": loss.derived(outcome.metrics)[
            "train/simulated_acceptance_length"
        ],
    }
    training.update(truncate_at_export(run, run.accelerator.unwrap_model(drafter), recipe.mtp))
    layers = recipe.capture_layers(run.target.num_layers)
    export_drafter(run, drafter, FAMILY, all_weights, training, outcome, layers)
    return TrainResult.of(run.output_dir, outcome, accuracies[0])
