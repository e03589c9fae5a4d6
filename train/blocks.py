"""The training blocks every drafter recipe is built from: setup -> loop -> save.

A family's recipe (`draft_lm.py`, `eagle.py`, ...) calls these in order:

    run = start_run(recipe)                 # folders, accelerator, target, data, features
    model, optimizer, scheduler = prepare_model(run.accelerator, model, recipe.train)
    outcome = train_steps(run, model, optimizer, scheduler, loss)  # resumes by itself
    export_drafter(run, model, family, weights, training, outcome)  # atomic, with its record

`loss` is the family's own piece (`FamilyLoss`): how many positions a batch supervises, and
the summed loss and statistics of one micro-batch. Everything else is the same for all: the
exact-resume data order, the step normalised by the global count of supervised positions
(across micro-batches and ranks, DeepSpeed included), atomic `save_state` checkpoints, tracker
logging, the replica check and the bf16 export. Testbed pretraining uses `optimizer_step`,
`resume` and `save_checkpoint` with its own batches.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from ..architectures.config_io import to_dict
from ..architectures.drafter_io import check_replaceable, output_path, save_drafter
from ..architectures.errors import DraftzooError
from ..architectures.output_folders import appending
from ..data.batching import collate
from ..data.capture import OfflineFeatures, OnlineFeatures
from ..data.token_dataset import split_heldout
from .checkpoint import CheckpointManager
from .data_order import data_passes, step_rows
from .distributed import check_replicas, make_accelerator, uses_deepspeed, whole_weights
from .optim import adamw
from .run_lock import RunLock, hold_work_dir
from .schedules import lr_lambda
from .setup import load_target, prepare_dataset, recipe_inputs, resolve_dirs, work_dir_of
from .start_from import StartPoint, load_start_point, read_start_point
from .trackers import prepare_trackers

logger = logging.getLogger(__name__)


class TrainRowsError(DraftzooError, ValueError):
    """`train.rows` asks for more rows than the data holds."""


class FamilyLoss(Protocol):
    """What a family adds to the shared loop."""

    #: progress-bar fields: metric name -> short label (the loss is always shown)
    shown: dict[str, str]

    def supervised(self, batch) -> torch.Tensor:
        """Positions of `batch` the loss is normalised by (a 0-d count). They are also the
        run's recorded `supervised_tokens`, unless the family defines `budget_positions`
        (supervised positions counted as every other family counts them) because its loss
        normalises by something else (DFlash: drafted slots)."""
        ...

    def teacher(self, batch) -> Any:
        """What the frozen target gives for `batch` (its hidden states), or None; computed
        outside autocast, so online capture equals offline shards."""
        ...

    def __call__(
        self, model, batch, teacher: Any, logs: bool
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(summed loss, {stat: [sum, count]}) of one micro-batch; `logs`: a logged step."""
        ...

    def derived(self, metrics: dict[str, float]) -> dict[str, float]:
        """Metrics computed from the averaged ones (e.g. a simulated acceptance length)."""
        ...

    def begin_step(self, step: int) -> None:
        """Called before optimizer step `step` (0-based), resumed runs included: losses whose
        weights follow a schedule read it here."""
        ...


@dataclass
class Run:
    """Everything a recipe's loop needs, built once by `start_run`."""

    recipe: Any  # the family's typed recipe (has .train, .target, .data, .capture)
    accelerator: Any
    target: Any  # the frozen `TargetAdapter`
    dataset: Any  # the training rows
    heldout: Any  # the held-out rows (`data.heldout_rows`), or None
    report: Any  # the data's `RowReport`
    data_hash: str
    features: Callable  # batch -> {HF index: [b, s, h]} target states
    output_dir: Path
    work_dir: Path
    lock: RunLock | None = None  # this run's hold on work_dir, released once it is saved
    start: StartPoint | None = None  # `train.start_from`, checked at set-up

    @property
    def config(self):
        """The recipe's `TrainConfig`."""
        return self.recipe.train

    @property
    def training_rows(self) -> int:
        """How many of the dataset's rows the steps draw from (`train.rows`, else all)."""
        return self.config.rows or len(self.dataset)


@dataclass
class Progress:
    """Where a run stands; saved in every checkpoint."""

    step: int = 0
    train_seconds: float = 0.0
    supervised_tokens: int = 0


@dataclass
class Outcome:
    """What `train_steps` measured."""

    progress: Progress
    resumed_from: int
    metrics: dict[str, float]  # the last logged metrics
    data_passes: float


def start_run(recipe) -> Run:
    """Folders, the accelerator (precision, trackers), the seed, the frozen target, the
    tokenized data and its target-state source (online forward or offline shards)."""
    # refused now, not after the last step
    check_replaceable(output_path(recipe.output_dir), recipe_inputs(recipe))
    fresh = not work_dir_of(recipe).exists()
    output_dir, work_dir, cache_dir = resolve_dirs(recipe)
    lock = hold_work_dir(work_dir)  # a second run of the same recipe is refused here
    try:
        run = _set_up(recipe, output_dir, work_dir, cache_dir)
    except (DraftzooError, OSError):  # refused (or a file that cannot be read) at set-up
        lock.release()
        if fresh:  # refused before the first step: leave no run folder behind
            shutil.rmtree(work_dir, ignore_errors=True)
        raise
    run.lock = lock
    return run


def _set_up(recipe, output_dir: Path, work_dir: Path, cache_dir: Path) -> Run:
    from accelerate.utils import ProjectConfiguration, set_seed

    cfg = recipe.train
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
    dataset, heldout = split_heldout(dataset, recipe.data.heldout_rows)
    layers = recipe.capture_layers(target.num_layers)
    if cfg.rows is not None and cfg.rows > len(dataset):
        raise TrainRowsError(f"train.rows {cfg.rows} is more than the {len(dataset)} training rows")
    if recipe.capture.mode == "online":
        features = OnlineFeatures(target, layers, recipe.capture.dtype)
    else:
        # the first `train.rows` samples are all a run without held-out rows reads
        rows_read = cfg.rows if heldout is None else None
        features = OfflineFeatures(Path(recipe.capture.dir), layers, rows_read)
        features.check(target.fingerprint(), data_hash, recipe.capture.dtype)
    start = None
    if cfg.start_from is not None:
        start = read_start_point(cfg.start_from, cfg.max_steps, data_hash)
    return Run(
        recipe,
        accelerator,
        target,
        dataset,
        heldout,
        report,
        data_hash,
        features,
        output_dir,
        work_dir,
        start=start,
    )


def prepare_model(accelerator, model, cfg, schedule: str | None = None, lr_scales=None):
    """(model, optimizer, scheduler) handed to `accelerator.prepare`; the scheduler is
    checkpointed with the rest. `schedule` overrides `cfg.schedule` (testbed: cosine);
    `lr_scales` {parameter-name prefix: scale} gives parts of the model their own rate."""
    optimizer = adamw(model, cfg.lr, cfg.weight_decay, cfg.beta2, lr_scales)
    kind = schedule or cfg.schedule
    decay = cfg.decay_fraction if kind == "wsd" else 1.0  # only "wsd" has a decay share
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(kind, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio, decay)
    )
    model, optimizer = accelerator.prepare(model, optimizer)
    # the scheduler's state goes into progress.json (`save_checkpoint`), not a pickle
    return model, optimizer, scheduler


def resume(
    accelerator, checkpoints: CheckpointManager, scheduler, start: StartPoint | None = None
) -> Progress:
    """Load the newest complete checkpoint, if any (partial saves are removed first), else
    `start`, another run's checkpoint, if given.

    Model, optimizer and RNG states come back through `accelerator.load_state` (tensors read
    with `weights_only=True`, which cannot run code); the scheduler from progress.json."""
    if accelerator.is_main_process:
        checkpoints.clean_partial()
    accelerator.wait_for_everyone()
    latest = checkpoints.latest()
    if latest is None and start is None:
        return Progress()
    if latest is None:
        path, saved = start.path, start.progress
        load_start_point(accelerator, start)
    else:
        path, saved = latest
        accelerator.load_state(str(path))
    if "scheduler" in saved:
        scheduler.load_state_dict(saved["scheduler"])
    else:  # a checkpoint from before the scheduler was saved here: its state is a function of step
        for _ in range(saved["step"]):
            scheduler.step()
    logger.info("resumed from %s at step %d", path, saved["step"])
    return Progress(saved["step"], saved["train_seconds"], saved.get("supervised_tokens", 0))


def save_checkpoint(
    accelerator,
    checkpoints: CheckpointManager,
    progress: Progress,
    scheduler,
    data_hash: str | None = None,
) -> None:
    """An atomic `save_state` at `progress.step` with the scheduler's state in JSON and, for a
    drafter's run, the data's hash (`train.start_from` continues only on the same data); every
    process calls it."""
    saved = {
        "train_seconds": progress.train_seconds,
        "supervised_tokens": progress.supervised_tokens,
        "scheduler": scheduler.state_dict(),
    }
    if data_hash is not None:
        saved["data_hash"] = data_hash
    checkpoints.save(accelerator, progress.step, saved)


def optimizer_step(accelerator, model, optimizer, scheduler, batches, loss, cfg, logs=True):
    """One optimizer step over `batches` (this rank's micro-batches).

    The summed loss of each micro-batch is scaled so the gradient is sum / (supervised
    positions over all micro-batches and ranks): DDP averages over ranks and DeepSpeed also
    divides by the accumulation steps, so the scale undoes both. Returns (global count,
    {stat: summed tensor}) with the loss under "loss"."""
    deepspeed = uses_deepspeed(accelerator)
    local = torch.stack([loss.supervised(b) for b in batches]).sum().reshape(1)
    global_count = int(accelerator.reduce(local.to(accelerator.device), reduction="sum").item())
    world = accelerator.num_processes
    scale = world * (cfg.grad_accum if deepspeed else 1) / max(global_count, 1)
    totals: dict[str, torch.Tensor] = {}
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        teacher = loss.teacher(batch)
        context = nullcontext() if last or deepspeed else accelerator.no_sync(model)
        with context, accelerator.autocast():
            loss_sum, stats = loss(model, batch, teacher, logs)
            accelerator.backward(loss_sum * scale)  # DeepSpeed: its engine steps at the boundary
        value = loss_sum.detach().float()
        stats["loss"] = torch.stack([value, torch.zeros_like(value)])
        for name, stat in stats.items():
            totals[name] = totals.get(name, 0) + stat.detach().float().to(accelerator.device)
    if not deepspeed:
        accelerator.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad()
    scheduler.step()
    return global_count, totals


def averaged(accelerator, totals: dict[str, torch.Tensor], global_count: int) -> dict:
    """{"train/loss": loss per supervised position, "train/<stat>": sum / count} over ranks."""
    names = sorted(totals)
    summed = accelerator.reduce(torch.stack([totals[n] for n in names]), reduction="sum")
    values = dict(zip(names, summed.tolist(), strict=True))
    metrics = {"train/loss": values.pop("loss")[0] / max(global_count, 1)}
    for name, (total, count) in values.items():
        metrics[f"train/{name}"] = total / max(count, 1)
    return metrics


def step_batches(run: Run, step: int) -> tuple[list[list[int]], list]:
    """(row plan, collated micro-batches on the device) of this rank at `step`."""
    cfg, accelerator = run.config, run.accelerator
    plan = step_rows(
        run.training_rows,
        cfg.seed,
        step,
        cfg.micro_batch_size,
        cfg.grad_accum,
        accelerator.process_index,
        accelerator.num_processes,
    )
    pad_id = run.target.tokenizer.pad_token_id or 0
    batches = [collate([run.dataset[i] for i in rows], pad_id) for rows in plan]
    return plan, [b.to(accelerator.device) for b in batches]


def train_steps(run: Run, model, optimizer, scheduler, loss: FamilyLoss) -> Outcome:
    """The loop: resume, then every step's batches, optimizer step, logs and checkpoints."""
    from tqdm.auto import tqdm

    cfg, accelerator = run.config, run.accelerator
    checkpoints = CheckpointManager(
        run.work_dir / "checkpoints", keep=cfg.keep_checkpoints, pinned=cfg.checkpoint_steps
    )
    progress = resume(accelerator, checkpoints, scheduler, run.start)
    resumed_from = progress.step
    accelerator.init_trackers(
        cfg.project,
        config={"recipe": json.dumps(to_dict(run.recipe)), "data_hash": run.data_hash},
        init_kwargs={"wandb": {"name": run.recipe.name}},
    )
    rows, world = run.training_rows, accelerator.num_processes
    passes = data_passes(rows, cfg.max_steps, cfg.micro_batch_size, cfg.grad_accum, world)
    logger.info("%d steps: %.3g passes over the %d training rows", cfg.max_steps, passes, rows)
    bar = tqdm(
        total=cfg.max_steps, initial=progress.step, disable=not accelerator.is_local_main_process
    )
    began = time.perf_counter() - progress.train_seconds
    seen_rows = run.work_dir / f"rows-rank{accelerator.process_index}.jsonl"
    metrics: dict[str, float] = {}
    model.train()
    try:  # the bar ends its line before an error is said
        for step in range(progress.step, cfg.max_steps):
            done = step + 1
            logs = done % cfg.log_every == 0 or done == cfg.max_steps
            plan, batches = step_batches(run, step)
            loss.begin_step(step)
            count, totals = optimizer_step(
                accelerator, model, optimizer, scheduler, batches, loss, cfg, logs
            )
            budget = budget_count(accelerator, loss, batches, count)
            progress.step, progress.supervised_tokens = done, progress.supervised_tokens + budget
            progress.train_seconds = time.perf_counter() - began
            bar.update(1)
            with appending(seen_rows) as handle:  # audit trail: the rows each rank trained on
                handle.write(json.dumps({"step": step, "rows": plan}) + "\n")
            if logs:
                metrics = _log_step(run, scheduler, loss, totals, count, progress, bar)
            due = done % cfg.checkpoint_every == 0 or done in cfg.checkpoint_steps
            if due and done < cfg.max_steps:
                save_checkpoint(accelerator, checkpoints, progress, scheduler, run.data_hash)
    finally:
        bar.close()
    progress.train_seconds = time.perf_counter() - began
    return Outcome(progress, resumed_from, metrics, passes)


def budget_count(accelerator, loss, batches, count: int) -> int:
    """The step's supervised positions over all ranks, counted alike for every family (the
    training budget): `count`, the loss's normaliser, unless the family's loss normalises by
    something else and counts its positions with `budget_positions`."""
    counted = getattr(loss, "budget_positions", None)
    if counted is None:
        return count
    local = torch.stack([counted(b) for b in batches]).sum().reshape(1)
    return int(accelerator.reduce(local.to(accelerator.device), reduction="sum").item())


def _log_step(run, scheduler, loss, totals, count, progress, bar) -> dict[str, float]:
    """Average the step's statistics over ranks, log them, show them on the bar."""
    metrics = averaged(run.accelerator, totals, count)
    metrics["lr"] = scheduler.get_last_lr()[0]
    metrics.update(loss.derived(metrics))
    metrics["supervised_tokens"] = progress.supervised_tokens
    run.accelerator.log(metrics, step=progress.step)
    shown = {"loss": f"{metrics['train/loss']:.3f}"}
    shown.update({label: f"{metrics[n]:.3f}" for n, label in loss.shown.items() if n in metrics})
    bar.set_postfix(shown)
    return metrics


def all_weights(model, state_dict: dict) -> dict:
    """`export_drafter`'s `weights` for a drafter whose every tensor is its own."""
    return state_dict


def own_weights(model, state_dict: dict) -> dict:
    """`export_drafter`'s `weights` for a drafter sharing target weights: the entries of its
    `drafter_state_dict()`."""
    kept = set(model.drafter_state_dict())
    return {k: v for k, v in state_dict.items() if k in kept}


def cost_figures(run: Run, outcome: Outcome) -> dict[str, Any]:
    """What the run cost: supervised tokens per second (all processes), this process's peak
    memory (CUDA: allocated by torch; CPU: resident set) and the capture's storage."""
    seconds = outcome.progress.train_seconds
    device = run.accelerator.device
    if device.type == "cuda":
        peak, kind = torch.cuda.max_memory_allocated(device), "cuda allocated"
    else:
        import resource

        peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process RSS"
    capture = run.recipe.capture
    layers = run.recipe.capture_layers(run.target.num_layers)
    per_token = capture.storage.bytes_per_token(run.target.hidden_size, layers)
    return {
        "supervised_tokens_per_second": round(
            outcome.progress.supervised_tokens / seconds if seconds > 0 else 0.0, 1
        ),
        "peak_memory_mb": round(peak / 2**20, 1),
        "peak_memory_kind": kind,
        "capture": f"{capture.mode}, {capture.dtype}, {per_token} bytes per token"
        + (" (nothing stored)" if capture.mode == "online" else ""),
    }


def export_drafter(
    run: Run,
    model,
    family: str,
    weights: Callable[[Any, dict], dict],
    training: dict[str, Any],
    outcome: Outcome,
    layers: list[int] | None = None,
    files: dict[str, bytes] | None = None,
    record_fields: dict[str, Any] | None = None,
) -> None:
    """Check the replicas agree, gather the weights, and save the drafter (bf16 floats) with
    its record (`record_fields` at its top level) and `files` beside them; every process calls
    it. `weights(bare_model, state_dict)` picks what ships."""
    accelerator, cfg = run.accelerator, run.config
    accelerator.wait_for_everyone()
    replicas = check_replicas(accelerator, model, run.work_dir)
    state_dict = accelerator.get_state_dict(model)  # gathers ZeRO-3 shards; every rank calls
    if accelerator.is_main_process:
        bare = accelerator.unwrap_model(model)
        kept = {
            k: (v.to(torch.bfloat16) if v.is_floating_point() else v)
            for k, v in weights(bare, state_dict).items()
        }
        record = {
            "steps": cfg.max_steps,
            "supervised_tokens": outcome.progress.supervised_tokens,
            "data_passes": round(outcome.data_passes, 4),
            "final_loss": outcome.metrics.get("train/loss", float("nan")),
            **training,
            "train_seconds": round(outcome.progress.train_seconds, 1),
            **({"started_from": run.start.record()} if run.start else {}),
            **cost_figures(run, outcome),
            "mixed_precision": accelerator.mixed_precision,
            "num_processes": accelerator.num_processes,
            "distributed_type": str(accelerator.distributed_type),
            "replica_digests_equal": replicas,
            "rows": run.report.to_dict(),
        }
        save_drafter(
            bare,
            run.output_dir,
            state_dict=kept,
            family=family,
            target=run.target.fingerprint(),
            recipe=to_dict(run.recipe),
            data_hash=run.data_hash,
            layers=layers,
            tokenizer=run.target.tokenizer,
            extra={**(record_fields or {}), "training": record},
            inputs=recipe_inputs(run.recipe),
            files=files,
        )
    # drop the prepared (DDP-wrapped) model and optimizer first: the wrapper holds the process
    # group, which must not outlive the run, and DeepSpeed's engine needs the group to let go
    accelerator.free_memory()
    accelerator.end_training()
    if run.lock is not None:
        run.lock.release()
