"""Pretrain the testbed target: a `LlamaForCausalLM` on the prepared token stream.

The canonical Accelerate loop: `accumulate()`, autocast (`train.mixed_precision`; "auto" is
bf16 where the hardware has it natively), gradient clipping, cosine schedule, `save_state` /
`load_state` every `checkpoint_every` steps for exact resume, and trackers through
`init_trackers` / `log`. Batches are drawn from a generator seeded by
(seed, step, rank), so a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..architectures.config_io import to_dict
from .distributed import cpu_only
from .optim import adamw
from .precision import resolve_mixed_precision, training_device
from .schedules import lr_lambda
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


def _latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    found = [p for p in checkpoint_dir.glob("checkpoint_*") if (p / "progress.json").is_file()]
    if not found:
        return None
    return max(found, key=lambda p: int(re.sub(r"\D", "", p.name) or 0))


def pretrain(
    config: TestbedConfig, data: PreparedData, work_dir: Path, output_dir: Path
) -> PretrainResult:
    """Train the target from `data`, resuming from `work_dir` checkpoints; save to `output_dir`."""
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    cfg = config.train
    work_dir = Path(work_dir)
    accelerator = Accelerator(
        cpu=cpu_only(),
        mixed_precision=resolve_mixed_precision(cfg.mixed_precision, training_device(cpu_only())),
        gradient_accumulation_steps=cfg.grad_accum,
        log_with=list(cfg.log_with) or None,
        project_config=ProjectConfiguration(
            project_dir=str(work_dir),
            automatic_checkpoint_naming=True,
            total_limit=2,
        ),
    )
    set_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(data.tokenizer_dir)
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    model = build_target_model(config, len(tokenizer), special)
    optimizer = adamw(model, cfg.lr, cfg.weight_decay, cfg.beta2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda("cosine", cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio)
    )
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(scheduler)  # stepped once per optimizer step

    train_tokens = load_tokens(data.train_tokens)
    windows = heldout_windows(load_tokens(data.heldout_tokens), cfg.seq_len, cfg.eval_windows)
    unigram = unigram_loss(train_tokens, windows[:, 1:], len(tokenizer))
    checkpoint_dir = work_dir / "checkpoints"
    start_step, elapsed = 0, 0.0
    latest = _latest_checkpoint(checkpoint_dir)
    if latest is not None:
        accelerator.load_state(str(latest))
        progress = json.loads((latest / "progress.json").read_text())
        start_step, elapsed = progress["step"], progress["train_seconds"]
        accelerator.project_configuration.iteration = progress["checkpoint_iteration"] + 1
        logger.info("resumed from %s at step %d", latest, start_step)

    accelerator.init_trackers("draftzoo-testbed", config={"recipe": json.dumps(to_dict(config))})
    tokens_per_step = (
        cfg.seq_len * cfg.micro_batch_size * cfg.grad_accum * accelerator.num_processes
    )
    bar = tqdm(
        total=cfg.max_steps,
        initial=start_step,
        disable=not accelerator.is_local_main_process,
        desc=config.name,
    )
    heldout = float("nan")
    began = time.perf_counter() - elapsed
    model.train()
    for step in range(start_step, cfg.max_steps):
        for micro in range(cfg.grad_accum):
            batch = sample_windows(
                train_tokens,
                cfg.seq_len,
                cfg.micro_batch_size,
                cfg.seed,
                step,
                accelerator.process_index,
                micro,
            ).to(accelerator.device)
            with accelerator.accumulate(model):
                logits = model(input_ids=batch[:, :-1]).logits
                loss = torch.nn.functional.cross_entropy(
                    logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1)
                )
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                optimizer.step()
                if accelerator.sync_gradients:
                    scheduler.step()
                optimizer.zero_grad()
        done = step + 1
        bar.update(1)
        if done % 10 == 0 or done == cfg.max_steps:
            train_loss = accelerator.reduce(loss.detach(), reduction="mean").item()
            bar.set_postfix(loss=f"{train_loss:.3f}", heldout=f"{heldout:.3f}")
            accelerator.log({"train/loss": train_loss, "lr": scheduler.get_last_lr()[0]}, step=done)
        if done % cfg.eval_every == 0 or done == cfg.max_steps:
            heldout = evaluate_heldout(accelerator.unwrap_model(model), windows)
            accelerator.log(
                {"heldout/loss": heldout, "heldout/ratio": heldout / unigram}, step=done
            )
            if accelerator.is_main_process:
                logger.info(
                    "step %d: held-out loss %.3f (unigram %.3f, ratio %.3f), %.0f tokens/s",
                    done,
                    heldout,
                    unigram,
                    heldout / unigram,
                    tokens_per_step * done / (time.perf_counter() - began),
                )
        if done % cfg.checkpoint_every == 0 and done < cfg.max_steps:
            _save_checkpoint(accelerator, checkpoint_dir, done, time.perf_counter() - began)
    bar.close()
    train_seconds = time.perf_counter() - began
    accelerator.wait_for_everyone()
    result = PretrainResult(
        steps=cfg.max_steps,
        train_tokens_seen=tokens_per_step * cfg.max_steps,
        heldout_loss=heldout,
        unigram_loss=unigram,
        parameters=sum(p.numel() for p in accelerator.unwrap_model(model).parameters()),
        train_seconds=train_seconds,
        mixed_precision=accelerator.mixed_precision,
    )
    if accelerator.is_main_process:
        _export(accelerator.unwrap_model(model), tokenizer, Path(output_dir))
    accelerator.end_training()
    return result


def _save_checkpoint(accelerator, checkpoint_dir: Path, step: int, seconds: float) -> None:
    """`save_state` plus the step it belongs to; the folder appears whole or not at all."""
    iteration = accelerator.project_configuration.iteration
    accelerator.save_state()
    if accelerator.is_main_process:
        saved = checkpoint_dir / f"checkpoint_{iteration}"
        progress = {"step": step, "train_seconds": seconds, "checkpoint_iteration": iteration}
        tmp = saved / "progress.json.tmp"
        tmp.write_text(json.dumps(progress))
        tmp.replace(saved / "progress.json")
    accelerator.wait_for_everyone()


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
