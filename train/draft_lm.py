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

import json
import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..architectures.config_io import to_dict
from ..architectures.draft_lm import DraftLMConfig, build_draft_lm
from ..architectures.drafter_io import save_drafter
from ..data.batching import collate
from ..data.capture import CaptureConfig, OfflineFeatures, OnlineFeatures, target_logits
from ..data.token_dataset import DataConfig
from .checkpoint import CheckpointManager
from .data_order import data_passes, step_rows
from .distributed import check_replicas, make_accelerator, uses_deepspeed, whole_weights
from .losses import DISTILL_LOSSES, distill_loss, top1_agreement, total_variation
from .optim import adamw
from .recipe_config import TargetSpec, TrainConfig, TrainResult
from .schedules import lr_lambda
from .setup import load_target, prepare_dataset, resolve_dirs
from .trackers import prepare_trackers

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistillConfig:
    """What the draft LM learns from."""

    loss: str = "fkl"  # "fkl", "tvd", "jsd" (against the target's logits) or "ce" (data labels)
    temperature: float = 1.0  # softens both distributions for fkl / tvd / jsd

    def __post_init__(self) -> None:
        if self.loss not in DISTILL_LOSSES:
            raise ValueError(f"distill.loss must be one of {DISTILL_LOSSES}, got {self.loss!r}")
        if self.temperature <= 0:
            raise ValueError("distill.temperature must be > 0")


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


def _loss_sums(recipe, draft, target, states, batch):
    """Summed loss, top-1 agreement and 1 - TVD over the supervised positions of `batch`.

    `states` are the target's captured hidden states for `batch` (None for `loss: ce`).
    """
    keep = batch.supervised_targets()  # [b, s-1]
    labels = batch.input_ids[:, 1:][keep]
    draft_logits = draft(**batch.model_inputs()).logits[:, :-1][keep]
    if recipe.distill.loss == "ce":
        target_logits_kept = None
        loss = distill_loss("ce", draft_logits, None, labels)
    else:
        final = states[target.num_layers][:, :-1][keep]
        target_logits_kept = target_logits(target, final)
        loss = distill_loss(
            recipe.distill.loss,
            draft_logits,
            target_logits_kept,
            labels,
            recipe.distill.temperature,
        )
    with torch.no_grad():
        if target_logits_kept is None:
            agree = (draft_logits.argmax(-1) == labels).float().sum()
            alpha = torch.tensor(float("nan"))
        else:
            agree = top1_agreement(draft_logits, target_logits_kept).sum()
            alpha = (1.0 - total_variation(draft_logits, target_logits_kept)).sum()
    return loss.sum(), agree, alpha


def run(recipe: DraftLMRecipe) -> TrainResult:
    """Train and export the draft LM; resumes from the newest complete checkpoint."""
    from accelerate.utils import ProjectConfiguration, set_seed
    from tqdm.auto import tqdm

    cfg = recipe.train
    output_dir, work_dir, cache_dir = resolve_dirs(recipe)
    accelerator = make_accelerator(
        cfg.micro_batch_size,
        cfg.grad_accum,
        cfg.grad_clip,
        mixed_precision=cfg.mixed_precision,
        log_with=prepare_trackers(cfg.log_with, work_dir),
        project_config=ProjectConfiguration(project_dir=str(work_dir), logging_dir=str(work_dir)),
    )
    set_seed(cfg.seed)
    with whole_weights(accelerator):
        target = load_target(recipe.target, accelerator.device)
    dataset, report, data_hash = prepare_dataset(
        recipe.data, target.tokenizer, cache_dir, accelerator
    )
    layers = recipe.capture_layers(target.num_layers)
    if recipe.capture.mode == "online":
        features = OnlineFeatures(target, layers, recipe.capture.torch_dtype)
    else:
        features = OfflineFeatures(Path(recipe.capture.dir), layers)
        features.check(target.fingerprint(), data_hash)
    with whole_weights(accelerator):
        draft = build_draft_lm(recipe.draft, target.model)
    optimizer = adamw(draft, cfg.lr, cfg.weight_decay, cfg.beta2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(cfg.schedule, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio)
    )
    draft, optimizer = accelerator.prepare(draft, optimizer)
    accelerator.register_for_checkpointing(scheduler)
    deepspeed = uses_deepspeed(accelerator)

    checkpoints = CheckpointManager(work_dir / "checkpoints", keep=cfg.keep_checkpoints)
    if accelerator.is_main_process:
        checkpoints.clean_partial()
    start_step, elapsed, supervised = 0, 0.0, 0
    latest = checkpoints.latest()
    if latest is not None:
        path, progress = latest
        accelerator.load_state(str(path))
        start_step, elapsed = progress["step"], progress["train_seconds"]
        supervised = progress["supervised_tokens"]
        logger.info("resumed from %s at step %d", path, start_step)

    accelerator.init_trackers(
        cfg.project,
        config={"recipe": json.dumps(to_dict(recipe)), "data_hash": data_hash},
        init_kwargs={"wandb": {"name": recipe.name}},
    )
    pad_id = target.tokenizer.pad_token_id or 0
    rank, world = accelerator.process_index, accelerator.num_processes
    passes = data_passes(len(dataset), cfg.max_steps, cfg.micro_batch_size, cfg.grad_accum, world)
    logger.info(
        "%d steps: %.3g passes over the %d training rows", cfg.max_steps, passes, len(dataset)
    )
    bar = tqdm(
        total=cfg.max_steps, initial=start_step, disable=not accelerator.is_local_main_process
    )
    began = time.perf_counter() - elapsed
    last_loss, last_agree = float("nan"), float("nan")
    seen_rows = work_dir / f"rows-rank{rank}.jsonl"
    draft.train()
    for step in range(start_step, cfg.max_steps):
        plan = step_rows(
            len(dataset), cfg.seed, step, cfg.micro_batch_size, cfg.grad_accum, rank, world
        )
        batches = [
            collate([dataset[i] for i in rows], pad_id).to(accelerator.device) for rows in plan
        ]
        local = torch.tensor(
            [sum(int(b.supervised_targets().sum()) for b in batches)], device=accelerator.device
        )
        global_count = int(accelerator.reduce(local, reduction="sum").item())
        # each rank's gradient is averaged over ranks (and DeepSpeed also divides by the
        # accumulation steps), so scale the summed loss to sum / global supervised count
        scale = world * (cfg.grad_accum if deepspeed else 1) / max(global_count, 1)
        totals = torch.zeros(3, device=accelerator.device)
        for i, batch in enumerate(batches):
            states = features(batch) if recipe.distill.loss != "ce" else None
            last = i == len(batches) - 1
            context = nullcontext() if last or deepspeed else accelerator.no_sync(draft)
            with context, accelerator.autocast():
                loss_sum, agree, alpha = _loss_sums(recipe, draft, target, states, batch)
                accelerator.backward(loss_sum * scale)  # DeepSpeed: engine steps at boundary
            totals += torch.stack([loss_sum.detach().float(), agree, alpha.to(totals)])
        if not deepspeed:
            accelerator.clip_grad_norm_(draft.parameters(), cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad()
        scheduler.step()
        supervised += global_count
        done = step + 1
        bar.update(1)
        with seen_rows.open("a") as handle:  # audit trail: the rows each rank trained on
            handle.write(json.dumps({"step": step, "rows": plan}) + "\n")
        if done % cfg.log_every == 0 or done == cfg.max_steps:
            summed = accelerator.reduce(totals, reduction="sum") / max(global_count, 1)
            last_loss, last_agree, alpha = (float(v) for v in summed.tolist())
            metrics = {
                "train/loss": last_loss,
                "train/top1_agreement": last_agree,
                "train/alpha": alpha,
                "lr": scheduler.get_last_lr()[0],
                "supervised_tokens": supervised,
            }
            accelerator.log(metrics, step=done)
            bar.set_postfix(loss=f"{last_loss:.3f}", top1=f"{last_agree:.3f}")
        if done % cfg.checkpoint_every == 0 and done < cfg.max_steps:
            checkpoints.save(
                accelerator,
                done,
                {"train_seconds": time.perf_counter() - began, "supervised_tokens": supervised},
            )
    bar.close()
    seconds = time.perf_counter() - began
    accelerator.wait_for_everyone()
    replicas = check_replicas(accelerator, draft, work_dir)
    state_dict = accelerator.get_state_dict(draft)  # gathers ZeRO-3 shards; every rank calls
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(draft)
        if model.config.tie_word_embeddings:  # stored once, tied again at load
            state_dict.pop("lm_head.weight", None)
        model.generation_config = target.model.generation_config
        save_drafter(
            model,
            output_dir,
            state_dict={k: v.to(torch.bfloat16) for k, v in state_dict.items()},
            family="draft_lm",
            target=target.fingerprint(),
            recipe=to_dict(recipe),
            data_hash=data_hash,
            tokenizer=target.tokenizer,
            extra={
                "training": {
                    "steps": cfg.max_steps,
                    "supervised_tokens": supervised,
                    "data_passes": round(passes, 4),
                    "final_loss": last_loss,
                    "top1_agreement": last_agree,
                    "train_seconds": round(seconds, 1),
                    "mixed_precision": accelerator.mixed_precision,
                    "num_processes": world,
                    "distributed_type": str(accelerator.distributed_type),
                    "replica_digests_equal": replicas,
                    "rows": report.to_dict(),
                }
            },
        )
    accelerator.end_training()
    return TrainResult(
        output_dir, cfg.max_steps, supervised, last_loss, last_agree, seconds, start_step, passes
    )
