"""Train an EAGLE-1 or EAGLE-3 drafter for a target, top to bottom: setup -> train -> save.

    accelerate launch [--config_file recipes/launch/<topology>.yaml] -m draftzoo \
        train recipes/eagle3/testbed-small.yaml

(or `draftzoo train RECIPE` for one process). The target's states at the drafter's layers (and
its final post-norm state, from which its logits are recomputed) come online or from offline
shards (`draftzoo capture RECIPE`, which captures exactly these layers). EAGLE-3 first counts
the supervised tokens to choose its draft vocabulary; its loss unrolls `eagle.ttt_steps`
training-time-test steps (`eagle_batch.py`). Setup, the loop, checkpoints, exact resume,
replica checks and the atomic export are the shared training blocks (`blocks.py`). Logged: the
loss, each TTT step's top-1 accuracy against the target's argmax, and the acceptance length
those accuracies imply for a chain.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from ..architectures.eagle import (
    EagleConfig,
    EagleDrafter,
    build_eagle,
    init_draft_head,
    init_layer_from_target,
)
from ..data.capture import CaptureConfig
from ..data.token_dataset import DataConfig
from .blocks import export_drafter, own_weights, prepare_model, start_run, train_steps
from .distributed import whole_weights
from .draft_vocab import draft_vocab, truncate_at_export
from .eagle_batch import EagleLoss
from .recipe_config import TargetSpec, TrainConfig, TrainResult
from .setup import meta_target, model_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EagleRecipe:
    """A whole EAGLE recipe; `family` and `eagle.kind` must agree."""

    family: str = "eagle3"  # the registry name: "eagle1" or "eagle3"
    name: str = "eagle"  # run and tracker name
    output_dir: str = "runs/eagle"  # the exported drafter
    work_dir: str | None = None  # checkpoints and logs (default: <output_dir>.work)
    cache_dir: str | None = None  # tokenized data cache (default: $DRAFTZOO_CACHE/data)
    target: TargetSpec = field(default_factory=TargetSpec)
    data: DataConfig = field(default_factory=DataConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    eagle: EagleConfig = field(default_factory=EagleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if self.family not in ("eagle1", "eagle3"):
            raise ValueError(f"family must be 'eagle1' or 'eagle3', got {self.family!r}")
        if self.eagle.kind != self.family:
            raise ValueError(f"eagle.kind {self.eagle.kind!r} must equal family {self.family!r}")

    def capture_layers(self, num_target_layers: int) -> list[int]:
        """HF indices the recipe reads from the target: the drafter's and the final one."""
        layers = self.eagle.resolved_layers(num_target_layers)
        return sorted({*layers, num_target_layers})


def check_on_meta(recipe: EagleRecipe, target_config) -> dict:
    """Build target and drafter on the meta device and check they fit (no weights)."""
    target = meta_target(target_config, recipe.data.max_length)
    with torch.device("meta"):
        drafter = build_eagle(recipe.eagle, target)
    return {
        "target_parameters": sum(p.numel() for p in target.parameters()),
        "drafter_parameters": sum(p.numel() for p in drafter.parameters()),
        "hidden_state_layers": list(drafter.layers),
        "draft_vocab_size": drafter.draft_vocab_size,
        "vocab_size": target.lm_head.weight.shape[0],
        "target_layers": target.num_layers,
    }


def check_recipe(recipe: EagleRecipe) -> dict:
    """`check_on_meta` with the target's config found by name."""
    return check_on_meta(recipe, model_config(recipe.target.path))


def _build(recipe: EagleRecipe, run) -> EagleDrafter:
    """The drafter for the run's target; EAGLE-3 chooses its draft vocabulary first."""
    target = run.target
    vocab = target.lm_head.weight.shape[0]
    with whole_weights(run.accelerator):
        drafter = build_eagle(recipe.eagle, target)  # refuses missing layers before any step
        if recipe.eagle.init_layer is not None:
            init_layer_from_target(drafter, target, recipe.eagle.init_layer)
        if drafter.kind == "eagle3":
            d2t, t2d, covered = draft_vocab(recipe.eagle, run.dataset, vocab)
            drafter.set_vocab_map(d2t, t2d)
            init_draft_head(drafter, target)
            logger.info(
                "draft vocabulary: %d of %d tokens, covering %.4f of supervised tokens",
                drafter.draft_vocab_size,
                vocab,
                covered,
            )
    return drafter.to(run.accelerator.device)


def run(recipe: EagleRecipe) -> TrainResult:
    """Train and export the drafter; resumes from the newest complete checkpoint."""
    run = start_run(recipe)
    drafter, optimizer, scheduler = prepare_model(
        run.accelerator, _build(recipe, run), recipe.train
    )
    module = run.accelerator.unwrap_model(drafter)
    loss = EagleLoss(recipe.eagle, module, run.target, run.features, recipe.train.loss_chunk_rows)
    outcome = train_steps(run, drafter, optimizer, scheduler, loss)
    accuracies = loss.accuracies(outcome.metrics)
    training = {
        "ttt_accuracy": accuracies,
        "simulated_acceptance_length": loss.derived(outcome.metrics)[
            "train/simulated_acceptance_length"
        ],
    }
    if module.kind == "eagle1":
        training.update(truncate_at_export(run, module, recipe.eagle))
    export_drafter(run, drafter, recipe.family, own_weights, training, outcome, list(module.layers))
    return TrainResult.of(run.output_dir, outcome, accuracies[0])
