"""Pretrain the testbed target: a `LlamaForCausalLM` on the prepared token stream.

On the shared training blocks (`blocks.py`): the accelerator (autocast per
`train.mixed_precision`; "auto" is bf16 where the hardware has it natively), AdamW with a cosine
schedule, the step normalised by every token of the step's windows across micro-batches and
ranks, atomic `save_state` checkpoints every `checkpoint_every` steps for exact resume, and
trackers through `init_trackers` / `log`. Windows are drawn from a generator seeded by
(seed, step, rank, micro-batch), so a resumed run sees exactly the batches an uninterrupted one
would.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from ..architectures.config_io import to_dict
from .blocks import averaged, optimizer_step, prepare_model, resume, save_checkpoint
from .checkpoint import CheckpointManager
from .distributed import make_accelerator
from .testbed_config import TestbedConfig
from .testbed_data import PreparedData, heldout_windows, load_tokens, unigram_loss

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PretrainResult:
    """What the finished run measured."""

    steps: int
    train_tokens_seen: int
    heldout_loss: float
    unigram_loss: float
    parameters: int
    train_seconds: float
    mixed_precision: str  # the autocast precision it trained in ("bf16" or "no")

    @property
    def loss_ratio(self) -> float:
        """Held-out loss over the unigram loss (lower is better; the bar is <= 0.5)."""
        return self.heldout_loss / self.unigram_loss


def build_target_model(config: TestbedConfig, vocab_size: int, special_ids: dict[str, int]):
    """A fresh `LlamaForCausalLM` with the recipe's shape."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model_config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=config.model.hidden_size,
        intermediate_size=config.model.intermediate_size,
        num_hidden_layers=config.model.num_hidden_layers,
        num_attention_heads=config.model.num_attention_heads,
        num_key_value_heads=config.model.num_key_value_heads,
        max_position_embeddings=config.model.max_position_embeddings,
        rope_theta=config.model.rope_theta,
        tie_word_embeddings=config.model.tie_word_embeddings,
        **special_ids,
    )
    return LlamaForCausalLM(model_config)


def sample_windows(
    tokens: np.ndarray, seq_len: int, count: int, seed: int, step: int, rank: int, micro: int
) -> torch.Tensor:
    """`count` random windows of `seq_len + 1` tokens, fixed by (seed, step, rank, micro)."""
    rng = np.random.default_rng([seed, step, rank, micro])
    starts = rng.integers(0, tokens.size - seq_len - 1, size=count)
    return torch.from_numpy(
        np.stack([np.asarray(tokens[s : s + seq_len + 1]) for s in starts]).astype(np.int64)
    )


@torch.no_grad()
def evaluate_heldout(model, windows: np.ndarray, batch_size: int = 16) -> float:
    """Mean next-token cross-entropy (nats) over the held-out windows."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(windows), batch_size):
        batch = torch.from_numpy(windows[start : start + batch_size])
        logits = model(input_ids=batch[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1), reduction="sum"
        )
        total += loss.item()
        count += batch[:, 1:].numel()
    model.train()
    return total / count


class WindowLoss:
    """Next-token cross-entropy summed over every position of a window batch."""

    shown: ClassVar[dict[str, str]] = {}

    def supervised(self, batch: torch.Tensor) -> torch.Tensor:
        return torch.tensor(batch[:, 1:].numel())

    def teacher(self, batch: torch.Tensor) -> None:
        return None

    def __call__(self, model, batch: torch.Tensor, teacher: None, logs: bool = True):
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1), reduction="sum"
        )
        return loss, {}

    def derived(self, metrics: dict[str, float]) -> dict[str, float]:
        return {}


def _tokenizer_and_model(config: TestbedConfig, data: PreparedData):
    """The testbed's tokenizer and a fresh model whose special ids are the tokenizer's."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(data.tokenizer_dir)
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    return tokenizer, build_target_model(config, len(tokenizer), special)


def pretrain(
    config: TestbedConfig, data: PreparedData, work_dir: Path, output_dir: Path
) -> PretrainResult:
    """Train the target from `data`, resuming from `work_dir` checkpoints; save to `output_dir`."""
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    cfg = config.train
    work_dir = Path(work_dir)
    accelerator = _accelerator(cfg, work_dir)
    set_seed(cfg.seed)
    tokenizer, model = _tokenizer_and_model(config, data)
    model, optimizer, scheduler = prepare_model(accelerator, model, cfg, schedule="cosine")
    train_tokens = load_tokens(data.train_tokens)
    windows = heldout_windows(load_tokens(data.heldout_tokens), cfg.seq_len, cfg.eval_windows)
    unigram = unigram_loss(train_tokens, windows[:, 1:], len(tokenizer))
    checkpoints = CheckpointManager(work_dir / "checkpoints")
    progress = resume(accelerator, checkpoints, scheduler)
    accelerator.init_trackers("draftzoo-testbed", config={"recipe": json.dumps(to_dict(config))})
    tokens_per_step = cfg.seq_len * cfg.micro_batch_size * cfg.grad_accum
    tokens_per_step *= accelerator.num_processes
    quiet = not accelerator.is_local_main_process
    bar = tqdm(total=cfg.max_steps, initial=progress.step, disable=quiet, desc=config.name)
    heldout, loss = float("nan"), WindowLoss()
    began = time.perf_counter() - progress.train_seconds
    model.train()
    for step in range(progress.step, cfg.max_steps):
        batches = _step_windows(train_tokens, cfg, step, accelerator)
        count, totals = optimizer_step(accelerator, model, optimizer, scheduler, batches, loss, cfg)
        progress.step, progress.supervised_tokens = step + 1, progress.supervised_tokens + count
        progress.train_seconds = time.perf_counter() - began
        bar.update(1)
        if progress.step % 10 == 0 or progress.step == cfg.max_steps:
            train_loss = averaged(accelerator, totals, count)["train/loss"]
            bar.set_postfix(loss=f"{train_loss:.3f}", heldout=f"{heldout:.3f}")
            accelerator.log(
                {"train/loss": train_loss, "lr": scheduler.get_last_lr()[0]}, step=progress.step
            )
        if progress.step % cfg.eval_every == 0 or progress.step == cfg.max_steps:
            heldout = _evaluate(accelerator, model, windows, unigram, progress, tokens_per_step)
        if progress.step % cfg.checkpoint_every == 0 and progress.step < cfg.max_steps:
            save_checkpoint(accelerator, checkpoints, progress, scheduler)
    bar.close()
    accelerator.wait_for_everyone()
    result = PretrainResult(
        steps=cfg.max_steps,
        train_tokens_seen=tokens_per_step * cfg.max_steps,
        heldout_loss=heldout,
        unigram_loss=unigram,
        parameters=sum(p.numel() for p in accelerator.unwrap_model(model).parameters()),
        train_seconds=time.perf_counter() - began,
        mixed_precision=accelerator.mixed_precision,
    )
    if accelerator.is_main_process:
        _export(accelerator.unwrap_model(model), tokenizer, Path(output_dir))
    accelerator.end_training()
    accelerator.free_memory()  # the prepared model holds the process group; let it go
    return result


def _accelerator(cfg, work_dir: Path):
    """The run's Accelerator: batch, accumulation, clipping, precision, trackers in work_dir."""
    from accelerate.utils import ProjectConfiguration

    return make_accelerator(
        cfg.micro_batch_size,
        cfg.grad_accum,
        cfg.grad_clip,
        mixed_precision=cfg.mixed_precision,
        log_with=list(cfg.log_with) or None,
        project_config=ProjectConfiguration(project_dir=str(work_dir), logging_dir=str(work_dir)),
    )


def _step_windows(train_tokens, cfg, step: int, accelerator) -> list[torch.Tensor]:
    """This rank's micro-batches of windows at `step`, on its device."""
    rank = accelerator.process_index
    return [
        sample_windows(
            train_tokens, cfg.seq_len, cfg.micro_batch_size, cfg.seed, step, rank, micro
        ).to(accelerator.device)
        for micro in range(cfg.grad_accum)
    ]


def _evaluate(accelerator, model, windows, unigram, progress, tokens_per_step) -> float:
    """Held-out loss now, logged (and reported with the training throughput)."""
    heldout = evaluate_heldout(accelerator.unwrap_model(model), windows)
    accelerator.log({"heldout/loss": heldout, "heldout/ratio": heldout / unigram}, progress.step)
    if accelerator.is_main_process:
        logger.info(
            "step %d: held-out loss %.3f (unigram %.3f, ratio %.3f), %.0f tokens/s",
            progress.step,
            heldout,
            unigram,
            heldout / unigram,
            tokens_per_step * progress.step / max(progress.train_seconds, 1e-9),
        )
    return heldout


def _export(model, tokenizer, output_dir: Path) -> None:
    """Save the target as a bf16 safetensors transformers folder with its tokenizer."""
    from transformers import GenerationConfig

    output_dir.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.config.torch_dtype = torch.bfloat16
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.eos_token_id, im_end],
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
