"""Distil a draft LM from a target, top to bottom: setup -> train -> save.

    accelerate launch [--config_file recipes/launch/<topology>.yaml] -m draftzoo \
        train recipes/draft_lm/testbed-small.yaml

(or `draftzoo train RECIPE` for one process). Conversations become masked token rows; the
target's final post-norm state comes online (target forward in the step) or offline (shards
from `draftzoo capture RECIPE`); the target logits are recomputed from it with the target's
lm_head; the draft LM learns them with forward KL, TVD or JSD (or only the data's own next
tokens, `loss: ce`). Every `checkpoint_every` steps an atomic `save_state`; a relaunch of the
same command resumes from the newest complete checkpoint with exactly the batches an
uninterrupted run would have seen. At the end the drafter alone is exported with its record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..architectures.draft_lm import DraftLMConfig, build_draft_lm, vocab_map_bytes
from ..architectures.drafter_io import DRAFT_VOCAB_FILE
from ..data.capture import CaptureConfig
from ..data.token_dataset import DataConfig
from .blocks import export_drafter, prepare_model, start_run, train_steps
from .distributed import whole_weights
from .draft_lm_loss import DistillConfig, DraftLMLoss
from .draft_vocab import map_at_export
from .recipe_config import TargetSpec, TrainConfig, TrainResult
from .setup import model_config

__all__ = ["DistillConfig", "DraftLMRecipe", "check_on_meta", "check_recipe", "run"]


@dataclass(frozen=True)
class DraftLMRecipe:
    """A whole draft-LM recipe."""

    family: str = "draft_lm"  # the registry name; must be "draft_lm" here
    name: str = "draft-lm"  # run and tracker name
    output_dir: str = "runs/draft-lm"  # the exported drafter
    work_dir: str | None = None  # checkpoints and logs (default: <output_dir>.work)
    cache_dir: str | None = None  # tokenized data cache (default: $DRAFTZOO_CACHE/data)
    target: TargetSpec = field(default_factory=TargetSpec)
    data: DataConfig = field(default_factory=DataConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    draft: DraftLMConfig = field(default_factory=DraftLMConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if self.family != "draft_lm":
            raise ValueError(f"family must be 'draft_lm' for this recipe, got {self.family!r}")

    def capture_layers(self, num_target_layers: int) -> list[int]:
        """HF indices the recipe reads from the target: the final post-norm state."""
        return [num_target_layers]


def check_on_meta(recipe: DraftLMRecipe, target_config, draft_config=None) -> dict:
    """Build target and draft on the meta device and check they fit together (no weights).

    `draft_config` is the config of `draft.init_from` when the recipe names one.
    """
    from transformers import AutoModelForCausalLM

    from ..architectures.draft_lm import draft_lm_model_config
    from ..architectures.target import TargetAdapter, TargetError

    with torch.device("meta"):
        target = TargetAdapter(AutoModelForCausalLM.from_config(target_config))
        if recipe.draft.init_from:
            if draft_config is None:
                raise ValueError("draft.init_from is set: pass its config")
            draft = AutoModelForCausalLM.from_config(draft_config)
        else:
            draft = AutoModelForCausalLM.from_config(
                draft_lm_model_config(recipe.draft, target_config)
            )
    target_vocab = target.lm_head.weight.shape[0]
    draft_vocab = draft.get_output_embeddings().weight.shape[0]
    if draft_vocab != target_vocab:
        raise TargetError(f"draft vocabulary {draft_vocab} != target vocabulary {target_vocab}")
    if recipe.draft.copy_target_embeddings and target.hidden_size != recipe.draft.hidden_size:
        raise TargetError(
            f"copy_target_embeddings needs draft hidden_size {target.hidden_size}, "
            f"got {recipe.draft.hidden_size}"
        )
    for name, config in (("target", target_config), ("draft", draft.config)):
        if config.max_position_embeddings < recipe.data.max_length:
            raise TargetError(
                f"data.max_length {recipe.data.max_length} exceeds the {name}'s "
                f"max_position_embeddings {config.max_position_embeddings}"
            )
    return {
        "target_parameters": sum(p.numel() for p in target.parameters()),
        "draft_parameters": sum(p.numel() for p in draft.parameters()),
        "vocab_size": target_vocab,
        "target_layers": target.num_layers,
    }


def check_recipe(recipe: DraftLMRecipe) -> dict:
    """`check_on_meta` with the target's (and `draft.init_from`'s) config found by name."""
    init_from = recipe.draft.init_from
    draft_config = model_config(init_from) if init_from else None
    return check_on_meta(recipe, model_config(recipe.target.path), draft_config)


def _export_weights(target):
    """The draft LM's weights as it ships: a tied head stored once, the target's generation
    settings beside it."""

    def pick(model, state_dict: dict) -> dict:
        if model.config.tie_word_embeddings:  # stored once, tied again at load
            state_dict.pop("lm_head.weight", None)
        model.generation_config = target.model.generation_config
        return state_dict

    return pick


def run(recipe: DraftLMRecipe) -> TrainResult:
    """Train and export the draft LM; resumes from the newest complete checkpoint."""
    run = start_run(recipe)
    with whole_weights(run.accelerator):
        draft = build_draft_lm(recipe.draft, run.target.model)
    draft, optimizer, scheduler = prepare_model(run.accelerator, draft, recipe.train)
    loss = DraftLMLoss(recipe.distill, run.target, run.features, recipe.train.loss_chunk_rows)
    outcome = train_steps(run, draft, optimizer, scheduler, loss)
    agreement = outcome.metrics.get("train/top1_agreement", float("nan"))
    training, files, fields = {"top1_agreement": agreement}, {}, {}
    found = map_at_export(run, recipe.draft, "its head truncated at export (the map beside it)")
    if found is not None:
        d2t, t2d, vocab_fields = found
        training.update(vocab_fields)
        files = {DRAFT_VOCAB_FILE: vocab_map_bytes(d2t, t2d)}
        fields = {"draft_vocab_file": DRAFT_VOCAB_FILE}
    export_drafter(
        run,
        draft,
        "draft_lm",
        _export_weights(run.target),
        training,
        outcome,
        files=files,
        record_fields=fields,
    )
    return TrainResult.of(run.output_dir, outcome, agreement)
