"""Train an EAGLE-1 or EAGLE-3 drafter for a target, top to bottom: setup -> train -> save.

    accelerate launch [--config_file recipes/launch/<topology>.yaml] -m draftzoo \
        train recipes/eagle3/testbed-small.yaml

(or `draftzoo train RECIPE` for one process). The target's states at the drafter's layers (and
its final post-norm state, from which its logits are recomputed) come online or from offline
shards (`draftzoo capture RECIPE`, which captures exactly these layers). EAGLE-3 first counts
the supervised tokens to choose its draft vocabulary; its loss unrolls `eagle.ttt_steps`
training-time-test steps. Checkpoints, exact resume, replica checks and the atomic export are
those of the draft-LM recipe. Logged: the loss, each TTT step's top-1 accuracy against the
target's argmax, and the acceptance length those accuracies imply for a chain.
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
from ..architectures.drafter_io import save_drafter
from ..architectures.eagle import EagleConfig, build_eagle, init_draft_head
from ..data.batching import collate
from ..data.capture import CaptureConfig, OfflineFeatures, OnlineFeatures, target_logits
from ..data.draft_vocab import build_vocab_map, count_supervised_tokens, coverage
from ..data.repeats import repeated_bigrams
from ..data.token_dataset import DataConfig
from .checkpoint import CheckpointManager
from .data_order import data_passes, step_rows
from .distributed import check_replicas, make_accelerator, uses_deepspeed, whole_weights
from .eagle_losses import (
    ahead,
    attention_allowed,
    eagle1_loss_sums,
    eagle3_loss_sums,
    noisy,
    real_positions,
    simulated_acceptance_length,
)
from .optim import adamw
from .recipe_config import TargetSpec, TrainConfig, TrainResult
from .schedules import lr_lambda
from .setup import load_target, prepare_dataset, resolve_dirs
from .trackers import prepare_trackers

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
    from transformers import AutoModelForCausalLM

    from ..architectures.target import TargetAdapter, TargetError

    with torch.device("meta"):
        target = TargetAdapter(AutoModelForCausalLM.from_config(target_config))
        drafter = build_eagle(recipe.eagle, target)
    if target_config.max_position_embeddings < recipe.data.max_length:
        raise TargetError(
            f"data.max_length {recipe.data.max_length} exceeds the target's "
            f"max_position_embeddings {target_config.max_position_embeddings}"
        )
    return {
        "target_parameters": sum(p.numel() for p in target.parameters()),
        "drafter_parameters": sum(p.numel() for p in drafter.parameters()),
        "hidden_state_layers": list(drafter.layers),
        "draft_vocab_size": drafter.draft_vocab_size,
        "vocab_size": target.lm_head.weight.shape[0],
        "target_layers": target.num_layers,
    }


def _loss_sums(recipe, drafter, module, target, states, batch, split_repeats=True):
    """Summed loss and stats {name: [sum, count]} for one micro-batch. `drafter` is the
    (possibly DDP/DeepSpeed-wrapped) model to call, `module` the bare drafter;
    `split_repeats` adds the first step's repeated/fresh accuracy (only logged steps need it)."""
    final = states[target.num_layers]
    logits = target_logits(target, final)
    config = recipe.eagle
    clean = torch.cat([states[layer] for layer in module.layers], dim=-1)
    clean = clean.to(module.fc.weight.dtype)
    fused = noisy(clean, config.feature_noise, drafter.training)
    select = [real_positions(batch, 2 + j) for j in range(config.ttt_steps)]
    allowed = attention_allowed(batch)
    outputs = drafter(batch.input_ids, fused, batch.position_ids, allowed, select)
    repeated = None
    if split_repeats:
        repeated = ahead(repeated_bigrams(batch.input_ids, batch.position_ids), 2, select[0])
    if config.kind == "eagle1":
        return eagle1_loss_sums(outputs, select[0], final, logits, config.token_loss, repeated)
    g0 = None
    if config.feature_weight:
        with torch.no_grad():
            g0 = module.fuse(clean)
    return eagle3_loss_sums(
        outputs,
        select,
        logits,
        module.d2t,
        module.t2d,
        config.ttt_decay,
        fused=g0,
        feature_weight=config.feature_weight,
        token_loss=config.token_loss,
        repeated=repeated,
        final=final if config.final_feature_weight else None,
        head_norm=target.final_norm if config.final_feature_weight else None,
        final_feature_weight=config.final_feature_weight,
    )


def _draft_vocab(recipe, dataset, vocab_size: int):
    """(d2t, t2d, coverage) of the EAGLE-3 draft vocabulary (identity when not pruned)."""
    size = recipe.eagle.draft_vocab_size or vocab_size
    if size == vocab_size:
        return torch.zeros(size, dtype=torch.long), torch.ones(size, dtype=torch.bool), 1.0
    counts = count_supervised_tokens(dataset, vocab_size)
    d2t, t2d = build_vocab_map(counts, size)
    return d2t, t2d, coverage(counts, t2d)


def run(recipe: EagleRecipe) -> TrainResult:
    """Train and export the drafter; resumes from the newest complete checkpoint."""
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
    vocab = target.lm_head.weight.shape[0]
    with whole_weights(accelerator):
        drafter = build_eagle(recipe.eagle, target)  # refuses missing layers before any step
        if drafter.kind == "eagle3":
            d2t, t2d, covered = _draft_vocab(recipe, dataset, vocab)
            drafter.set_vocab_map(d2t, t2d)
            init_draft_head(drafter, target)
            logger.info(
                "draft vocabulary: %d of %d tokens, covering %.4f of supervised tokens",
                drafter.draft_vocab_size,
                vocab,
                covered,
            )
    drafter.to(accelerator.device)
    optimizer = adamw(drafter, cfg.lr, cfg.weight_decay, cfg.beta2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(cfg.schedule, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio)
    )
    drafter, optimizer = accelerator.prepare(drafter, optimizer)
    accelerator.register_for_checkpointing(scheduler)
    deepspeed = uses_deepspeed(accelerator)
    module = accelerator.unwrap_model(drafter)
    steps = recipe.eagle.ttt_steps

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
    last_loss, accuracies = float("nan"), [float("nan")] * steps
    drafter.train()
    for step in range(start_step, cfg.max_steps):
        done = step + 1
        logs = done % cfg.log_every == 0 or done == cfg.max_steps
        plan = step_rows(
            len(dataset), cfg.seed, step, cfg.micro_batch_size, cfg.grad_accum, rank, world
        )
        batches = [
            collate([dataset[i] for i in rows], pad_id).to(accelerator.device) for rows in plan
        ]
        local = torch.tensor(
            [sum(int(real_positions(b, 2).sum()) for b in batches)], device=accelerator.device
        )
        global_count = int(accelerator.reduce(local, reduction="sum").item())
        scale = world * (cfg.grad_accum if deepspeed else 1) / max(global_count, 1)
        totals: dict[str, torch.Tensor] = {}
        for i, batch in enumerate(batches):
            states = features(batch)
            last = i == len(batches) - 1
            context = nullcontext() if last or deepspeed else accelerator.no_sync(drafter)
            with context, accelerator.autocast():
                loss_sum, stats = _loss_sums(recipe, drafter, module, target, states, batch, logs)
                accelerator.backward(loss_sum * scale)
            loss_value = loss_sum.detach().float()
            stats["loss"] = torch.stack([loss_value, torch.zeros_like(loss_value)])
            for name, value in stats.items():
                totals[name] = totals.get(name, 0) + value.detach().float().to(accelerator.device)
        if not deepspeed:
            accelerator.clip_grad_norm_(drafter.parameters(), cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad()
        scheduler.step()
        supervised += global_count
        bar.update(1)
        if logs:
            names = sorted(totals)
            summed = accelerator.reduce(torch.stack([totals[n] for n in names]), reduction="sum")
            values = dict(zip(names, summed.tolist(), strict=True))
            last_loss = values.pop("loss")[0] / max(global_count, 1)
            metrics = {"train/loss": last_loss, "lr": scheduler.get_last_lr()[0]}
            for name, (total, count) in values.items():
                metrics[f"train/{name}"] = total / max(count, 1)
            accuracies = [metrics[f"train/acc_{j}"] for j in range(steps)]
            metrics["train/simulated_acceptance_length"] = simulated_acceptance_length(accuracies)
            metrics["supervised_tokens"] = supervised
            accelerator.log(metrics, step=done)
            shown = {"loss": f"{last_loss:.3f}", "acc0": f"{accuracies[0]:.3f}"}
            if "train/acc_0_repeated" in metrics:
                shown["repeated"] = f"{metrics['train/acc_0_repeated']:.3f}"
            bar.set_postfix(shown)
        if done % cfg.checkpoint_every == 0 and done < cfg.max_steps:
            checkpoints.save(
                accelerator,
                done,
                {"train_seconds": time.perf_counter() - began, "supervised_tokens": supervised},
            )
    bar.close()
    seconds = time.perf_counter() - began
    accelerator.wait_for_everyone()
    replicas = check_replicas(accelerator, drafter, work_dir)
    state_dict = accelerator.get_state_dict(drafter)
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(drafter)
        kept = {k for k in model.drafter_state_dict()}
        weights = {
            k: (v.to(torch.bfloat16) if v.is_floating_point() else v)
            for k, v in state_dict.items()
            if k in kept
        }
        save_drafter(
            model,
            output_dir,
            state_dict=weights,
            family=recipe.family,
            target=target.fingerprint(),
            recipe=to_dict(recipe),
            data_hash=data_hash,
            layers=list(model.layers),
            tokenizer=target.tokenizer,
            extra={
                "training": {
                    "steps": cfg.max_steps,
                    "supervised_tokens": supervised,
                    "data_passes": round(passes, 4),
                    "final_loss": last_loss,
                    "ttt_accuracy": accuracies,
                    "simulated_acceptance_length": simulated_acceptance_length(accuracies),
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
        output_dir, cfg.max_steps, supervised, last_loss, accuracies[0], seconds, start_step, passes
    )
