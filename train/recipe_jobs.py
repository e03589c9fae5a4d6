"""What `draftzoo regenerate` and `draftzoo capture` run for a recipe: its target and data,
loaded the way training loads them.

    written, report = regenerate_for_recipe(recipe, Path("data/regen.jsonl"), config)
    summary = capture_for_recipe(recipe, Path("runs/capture"))
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..architectures.config_io import ConfigError
from ..architectures.defaults import target_location
from ..data.capture import capture_offline, estimate_bytes
from ..data.conversations import RowReport
from ..data.regenerate import RegenerateConfig, regenerate
from .distributed import partial_state
from .setup import cache_dir_of, load_target, prepare_dataset

logger = logging.getLogger(__name__)


def regenerate_for_recipe(
    recipe, output: Path, config: RegenerateConfig, writer: str | None = None
) -> tuple[int, RowReport]:
    """Replace the recipe's assistant turns with the target's own answers (or `writer`'s, a
    causal LM on the target's tokenizer) in `output`; (rows written now, report)."""
    # a writer named by a path that is not there is refused before anything is loaded
    writer_location = target_location(writer) if writer else None
    target = load_target(recipe.target, partial_state().device)
    writer_model = None
    if writer_location:
        writer_model = _load_writer(writer, writer_location, target)
    return regenerate(target, recipe.data, Path(output), config, writer_model)


def _load_writer(name: str, location: str, target):
    """A causal LM that shares the target's tokenizer, on the target's device."""
    import torch

    from ..architectures.safe_load import load_causal_lm, load_tokenizer
    from ..architectures.target import TargetError, tokenizer_hash

    if tokenizer_hash(load_tokenizer(location)) != tokenizer_hash(target.tokenizer):
        raise TargetError(f"--writer {name} does not share the target's tokenizer")
    writer = load_causal_lm(location, dtype=torch.float32)
    return writer.to(target.model.device).eval()


@dataclass(frozen=True)
class CaptureSummary:
    """What a capture read and wrote."""

    data: RowReport  # the rows the recipe's data gave
    rows: int  # rows captured (this run and earlier ones)
    shards: int
    layers: tuple[int, ...]
    estimated_bytes: int  # the disk estimate made before capturing
    bytes_per_token: int  # on disk, every layer (and FP8 scales) included
    out_dir: Path


def capture_for_recipe(
    recipe,
    out_dir: Path | None = None,
    layers: list[int] | None = None,
    announce: Callable[[str], None] = logger.info,
) -> CaptureSummary:
    """Capture the recipe's target states into shards in `out_dir` (default: the recipe's
    capture.dir) for offline training; `layers`: HF hidden-state indices (default: the ones
    the recipe's family reads). `announce` is told the disk estimate before any shard is
    written."""
    out_dir = Path(out_dir or recipe.capture.dir or "")
    if not str(out_dir) or str(out_dir) == ".":
        raise ConfigError("give --dir or set capture.dir in the recipe")
    state = partial_state()
    target = load_target(recipe.target, state.device)
    dataset, report, data_hash = prepare_dataset(
        recipe.data, target.tokenizer, cache_dir_of(recipe), state
    )
    layers = sorted(set(layers or recipe.capture_layers(target.num_layers)))
    config = replace(recipe.capture, mode="offline", dir=str(out_dir))
    need = estimate_bytes(dataset, target.hidden_size, layers, config.dtype)
    per_token = config.storage.bytes_per_token(target.hidden_size, layers)
    announce(f"data: {report.summary()}")
    announce(
        f"disk estimate: {need / 1e9:.3f} GB for {len(dataset)} rows, layers {layers}, "
        f"{config.dtype}, {per_token} bytes per token -> {out_dir}"
    )
    index = capture_offline(
        target, dataset, layers, out_dir, config, data_hash, target.tokenizer.pad_token_id or 0
    )
    rows = sum(shard["count"] for shard in index["shards"])
    return CaptureSummary(
        report, rows, len(index["shards"]), tuple(layers), need, per_token, out_dir
    )
