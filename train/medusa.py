"""Train Medusa-1 heads for a frozen target, top to bottom: setup -> train -> save.

    accelerate launch [--config_file recipes/launch/<topology>.yaml] -m draftzoo \\
        train recipes/medusa1/testbed-small.yaml

(or `draftzoo train RECIPE` for one process). The heads read the target's final post-norm
state, online (target forward in the step) or from offline shards (`draftzoo capture
RECIPE`); the loss and per-head accuracies are in `medusa_loss.py`. Setup, the loop,
checkpoints, exact resume, replica checks and the atomic export are the shared training blocks
(`blocks.py`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from ..architectures.medusa import MedusaConfig, MedusaHeads, build_medusa
from ..data.capture import CaptureConfig
from ..data.token_dataset import DataConfig
from .blocks import all_weights, export_drafter, prepare_model, start_run, train_steps
from .distributed import whole_weights
from .draft_vocab import draft_vocab
from .medusa_heldout import CalibrationConfig, calibration_record, heldout_batches
from .medusa_loss import MedusaLoss, MedusaLossConfig
from .recipe_config import TargetSpec, TrainConfig, TrainResult
from .setup import meta_target, model_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MedusaRecipe:
    """A whole Medusa-1 recipe."""

    family: str = "medusa1"  # the registry name; must be "medusa1" here
    name: str = "medusa1"  # run and tracker name
    output_dir: str = "runs/medusa1"  # the exported heads
    work_dir: str | None = None  # checkpoints and logs (default: <output_dir>.work)
    cache_dir: str | None = None  # tokenized data cache (default: $DRAFTZOO_CACHE/data)
    target: TargetSpec = field(default_factory=TargetSpec)
    data: DataConfig = field(default_factory=DataConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    medusa: MedusaConfig = field(default_factory=MedusaConfig)
    loss: MedusaLossConfig = field(default_factory=MedusaLossConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if self.family != "medusa1":
            raise ValueError(f"family must be 'medusa1' for this recipe, got {self.family!r}")

    def capture_layers(self, num_target_layers: int) -> list[int]:
        """HF indices the recipe reads from the target: the final post-norm state."""
        return [num_target_layers]


def check_on_meta(recipe: MedusaRecipe, target_config) -> dict:
    """Build target and heads on the meta device and check they fit (no weights)."""
    target = meta_target(target_config, recipe.data.max_length)
    with torch.device("meta"):
        heads = build_medusa(recipe.medusa, target)
    return meta_summary(target, heads)


def meta_summary(target, heads: MedusaHeads) -> dict:
    """What `--check` prints of a target and its heads built on the meta device."""
    return {
        "target_parameters": sum(p.numel() for p in target.parameters()),
        "head_parameters": sum(p.numel() for p in heads.parameters()),
        "num_heads": heads.num_heads,
        "draft_vocab_size": heads.draft_vocab_size,
        "vocab_size": target.lm_head.weight.shape[0],
        "target_layers": target.num_layers,
    }


def check_recipe(recipe: MedusaRecipe) -> dict:
    """`check_on_meta` with the target's config found by name."""
    return check_on_meta(recipe, model_config(recipe.target.path))


def run(recipe: MedusaRecipe) -> TrainResult:
    """Train and export the heads; resumes from the newest complete checkpoint."""
    run = start_run(recipe)
    token_map, covered = draft_token_map(recipe.medusa, run)
    with whole_weights(run.accelerator):
        heads: MedusaHeads = build_medusa(recipe.medusa, run.target, token_map=token_map)
    heads = heads.to(run.accelerator.device)
    heads, optimizer, scheduler = prepare_model(run.accelerator, heads, recipe.train)
    loss = MedusaLoss(
        recipe.loss,
        recipe.medusa.num_heads,
        run.target,
        run.features,
        recipe.train.loss_chunk_rows,
    )
    outcome = train_steps(run, heads, optimizer, scheduler, loss)
    training = {**loss.record(outcome.metrics), **covered}
    bare = run.accelerator.unwrap_model(heads)
    training.update(heldout_record(run, bare, run.target, recipe.calibration))
    layers = [run.target.num_layers]
    export_drafter(run, heads, recipe.family, all_weights, training, outcome, layers)
    return TrainResult.of(run.output_dir, outcome, training["head_top1_accuracy"][0])


def draft_token_map(config: MedusaConfig, run) -> tuple[torch.Tensor | None, dict]:
    """(token_map, training-record fields) of truncated heads: the `draft_vocab_size` most
    frequent supervised tokens of the run's data and the share of supervised tokens they cover;
    (None, {}) for heads over the whole vocabulary."""
    vocab = run.target.lm_head.weight.shape[0]
    if config.draft_vocab_size is None or config.draft_vocab_size >= vocab:
        return None, {}
    _, t2d, covered = draft_vocab(config, run.dataset, vocab)
    logger.info(
        "draft vocabulary: %d of %d tokens, covering %.4f of supervised tokens",
        config.draft_vocab_size,
        vocab,
        covered,
    )
    return t2d.nonzero().flatten(), {
        "draft_vocab_size": config.draft_vocab_size,
        "draft_vocab_coverage": round(covered, 6),
    }


def heldout_record(run, heads: MedusaHeads, target, calibration: CalibrationConfig) -> dict:
    """The heads' held-out rank accuracies and calibrated tree (main process; {} without
    held-out rows, and on the other processes)."""
    if run.heldout is None or not run.accelerator.is_main_process:
        return {}
    heads.eval()
    pad_id = run.target.tokenizer.pad_token_id or 0
    batches = heldout_batches(
        run.heldout, pad_id, run.config.micro_batch_size, run.accelerator.device
    )
    return calibration_record(heads, target, batches, calibration)
