"""Train Medusa-2: heads and a peft LoRA on the target, jointly, top to bottom.

    accelerate launch [--config_file recipes/launch/<topology>.yaml] -m draftzoo \\
        train recipes/medusa2/testbed-small.yaml

The target is adapted with a LoRA (`lora:`; the Medusa paper's rank 32, alpha 16 on every
decoder linear layer by default), the heads train at `heads_lr_scale` x the learning rate, the
heads' loss weight is ramped in, and the target's own loss is self-distillation against
itself with the adapter disabled (`medusa2_loss.py`). Heads may start from trained Medusa-1
heads (`init_heads`, Medusa's two-stage recipe). The drafter folder holds the heads and the
adapter in peft's format (`adapter/`); `draftzoo.load` merges the adapter into the base target.
Its record carries how far the adapter moved the target on held-out rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..architectures.config_io import ConfigError
from ..architectures.drafter_io import read_drafter_record
from ..architectures.lora_adapter import LoraSpec, attach_lora
from ..architectures.medusa import MedusaConfig, MedusaHeads, build_medusa, load_medusa
from ..data.capture import CaptureConfig
from ..data.token_dataset import DataConfig
from .blocks import export_drafter, prepare_model, start_run, train_steps
from .distributed import whole_weights
from .medusa import draft_token_map, heldout_record, meta_summary
from .medusa2_loss import Medusa2Loss, Medusa2LossConfig
from .medusa2_model import AdaptedTargetHeads
from .medusa_heldout import CalibrationConfig, heldout_batches, target_drift
from .recipe_config import TargetSpec, TrainConfig, TrainResult
from .setup import meta_target, model_config


@dataclass(frozen=True)
class Medusa2Recipe:
    """A whole Medusa-2 recipe."""

    family: str = "medusa2"  # the registry name; must be "medusa2" here
    name: str = "medusa2"  # run and tracker name
    output_dir: str = "runs/medusa2"  # the exported heads and adapter
    work_dir: str | None = None  # checkpoints and logs (default: <output_dir>.work)
    cache_dir: str | None = None  # tokenized data cache (default: $DRAFTZOO_CACHE/data)
    init_heads: str | None = None  # a Medusa-1 drafter folder to start the heads from
    heads_lr_scale: float = 4.0  # the heads' learning rate is this x train.lr
    target: TargetSpec = field(default_factory=TargetSpec)
    data: DataConfig = field(default_factory=DataConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    medusa: MedusaConfig = field(default_factory=MedusaConfig)
    lora: LoraSpec = field(default_factory=LoraSpec)
    loss: Medusa2LossConfig = field(default_factory=Medusa2LossConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if self.family != "medusa2":
            raise ValueError(f"family must be 'medusa2' for this recipe, got {self.family!r}")
        if self.capture.mode != "online":
            raise ValueError(
                "capture.mode must be 'online' for Medusa-2: the adapter changes the target's "
                "states every step, so they cannot be captured ahead"
            )
        if self.heads_lr_scale <= 0:
            raise ValueError("heads_lr_scale must be > 0")

    def capture_layers(self, num_target_layers: int) -> list[int]:
        """HF indices the recipe reads from the target: the final post-norm state."""
        return [num_target_layers]


def check_on_meta(recipe: Medusa2Recipe, target_config) -> dict:
    """Build target, LoRA and heads on the meta device and check they fit (no weights)."""
    target = meta_target(target_config, recipe.data.max_length)
    with torch.device("meta"):
        heads = build_medusa(recipe.medusa, target, recipe.family)
        peft_model = attach_lora(target.model, recipe.lora)
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    summary = meta_summary(target, heads)
    summary["target_parameters"] -= trainable  # the LoRA was injected into the target
    return {**summary, "lora_parameters": trainable}


def check_recipe(recipe: Medusa2Recipe) -> dict:
    """`check_on_meta` with the target's config found by name."""
    return check_on_meta(recipe, model_config(recipe.target.path))


def run(recipe: Medusa2Recipe) -> TrainResult:
    """Train and export heads and adapter; resumes from the newest complete checkpoint."""
    run = start_run(recipe)
    token_map, covered = (None, {}) if recipe.init_heads else draft_token_map(recipe.medusa, run)
    with whole_weights(run.accelerator):
        heads = _initial_heads(recipe, run.target, token_map)
        peft_model = attach_lora(run.target.model, recipe.lora)
    peft_model.peft_config["default"].base_model_name_or_path = recipe.target.path
    model = AdaptedTargetHeads(run.target, peft_model, heads).to(run.accelerator.device)
    loss = Medusa2Loss(recipe.loss, model, recipe.train.loss_chunk_rows)
    scales = {"heads.": recipe.heads_lr_scale}
    model, optimizer, scheduler = prepare_model(
        run.accelerator, model, recipe.train, lr_scales=scales
    )
    outcome = train_steps(run, model, optimizer, scheduler, loss)
    training = {
        **loss.record(outcome.metrics),
        "final_kl": outcome.metrics.get("train/kl", float("nan")),
        "lora": {"rank": recipe.lora.rank, "alpha": recipe.lora.alpha},
        **_heads_stage(recipe.init_heads),
        **covered,
    }
    bare = run.accelerator.unwrap_model(model)
    bare.eval()
    training.update(heldout_record(run, bare.heads, run.target, recipe.calibration))
    training.update(_drift_record(run, bare))
    layers = [run.target.num_layers]
    export_drafter(run, model, recipe.family, _trained_weights, training, outcome, layers)
    return TrainResult.of(run.output_dir, outcome, training["head_top1_accuracy"][0])


def _initial_heads(recipe: Medusa2Recipe, target, token_map=None) -> MedusaHeads:
    """Fresh heads, or trained Medusa-1 heads for this target (`init_heads`, with their own
    draft vocabulary)."""
    fresh = build_medusa(recipe.medusa, target, recipe.family, token_map)
    if recipe.init_heads is None:
        return fresh
    trained = load_medusa(recipe.init_heads, target)
    if trained.fields != {**fresh.fields, "draftzoo_family": trained.fields["draftzoo_family"]}:
        raise ConfigError(
            f"init_heads {recipe.init_heads} has {trained.num_heads} heads of "
            f"{trained.fields['medusa_num_layers']} layer(s); the recipe asks for "
            f"{recipe.medusa.num_heads} of {recipe.medusa.num_layers}"
        )
    fresh.load_state_dict(trained.state_dict())
    return fresh


def _heads_stage(init_heads: str | None) -> dict:
    """The heads-only stage the heads came from (Medusa's two-stage recipe): its steps,
    supervised tokens and time, so the drafter's whole training budget stays on record."""
    if init_heads is None:
        return {}
    trained = read_drafter_record(Path(init_heads)).get("training", {})
    keys = ("steps", "supervised_tokens", "train_seconds", "num_processes")
    return {"heads_stage": {key: trained[key] for key in keys if key in trained}}


def _drift_record(run, model: AdaptedTargetHeads) -> dict:
    """How far the adapter moved the target on held-out rows (main process; {} without
    held-out rows)."""
    if run.heldout is None or not run.accelerator.is_main_process:
        return {}
    pad_id = run.target.tokenizer.pad_token_id or 0
    batches = heldout_batches(
        run.heldout, pad_id, run.config.micro_batch_size, run.accelerator.device
    )
    drift = target_drift(run.target, model.original, batches)
    return {"target_drift": {name: round(value, 6) for name, value in drift.items()}}


def _trained_weights(model, state_dict: dict) -> dict:
    """The module's state dict is already only what was trained (LoRA and heads)."""
    return state_dict
