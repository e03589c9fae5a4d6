"""Setup steps every drafter recipe shares: folders, the frozen target, the token dataset."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch

from ..architectures.config_io import ConfigError
from ..architectures.defaults import COMMITTED_TARGET, data_cache_dir, recipes_dir, target_location
from ..architectures.output_folders import output_path
from ..architectures.target import TARGET_DTYPES, TargetAdapter
from ..data.token_dataset import DataConfig, build_token_dataset
from .recipe_config import TargetSpec

logger = logging.getLogger(__name__)


def work_dir_of(recipe) -> Path:
    """The run's working folder (checkpoints, logs): `work_dir`, else `<output_dir>.work`."""
    return Path(recipe.work_dir) if recipe.work_dir else Path(f"{recipe.output_dir}.work")


def cache_dir_of(recipe) -> Path:
    """The tokenized-data cache of a recipe (`cache_dir`, else the user's), created."""
    cache_dir = Path(recipe.cache_dir) if recipe.cache_dir else data_cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    return cache_dir


def resolve_dirs(recipe) -> tuple[Path, Path, Path]:
    """(output_dir, work_dir, cache_dir) of a recipe, created."""
    work_dir = output_path(work_dir_of(recipe))
    work_dir.mkdir(parents=True, exist_ok=True)
    return Path(recipe.output_dir), work_dir, cache_dir_of(recipe)


def recipe_inputs(recipe) -> tuple[str, ...]:
    """What a run reads from disk, which its output folder may not replace: the target's
    folder, the data file, and the checkpoints it starts from (`init_heads`, `init_from`)."""
    from ..architectures.target import TargetError

    found = [recipe.data.source, getattr(recipe, "init_heads", None)]
    with contextlib.suppress(TargetError):  # an unfetched target: the run refuses it itself
        found.append(target_path(recipe.target))
    for section in vars(recipe).values():
        found.append(getattr(section, "init_from", None))
    return tuple(str(p) for p in found if isinstance(p, str) and Path(p).expanduser().exists())


def target_path(spec: TargetSpec) -> str:
    """A folder or hub name; `testbed-small` is the target shipped with draftzoo."""
    return target_location(spec.path)


def load_target(spec: TargetSpec, device) -> TargetAdapter:
    """The frozen target (eval mode, no gradients) on `device`."""
    if spec.dtype not in TARGET_DTYPES:
        raise ConfigError(
            f"target.dtype must be one of {sorted(TARGET_DTYPES)}, got {spec.dtype!r}"
        )
    adapter = TargetAdapter.from_pretrained(target_path(spec), dtype=TARGET_DTYPES[spec.dtype])
    adapter.to(device).eval()
    adapter.requires_grad_(False)
    if adapter.tokenizer.pad_token_id is None and adapter.tokenizer.eos_token_id is not None:
        adapter.tokenizer.pad_token = adapter.tokenizer.eos_token
    return adapter


def prepare_dataset(config: DataConfig, tokenizer, cache_dir: Path, accelerator):
    """The tokenized dataset, built once by the main process and loaded by the others."""
    with accelerator.main_process_first():
        dataset, report, key = build_token_dataset(config, tokenizer, cache_dir)
    if accelerator.is_main_process:
        logger.info("data %s: %s", config.source, report.summary())
        for example in report.examples:
            logger.warning("rejected %s", example)
    return dataset, report, key


def shipped_config_path(name: str) -> Path:
    """Where draftzoo ships the public config.json of hub model `name` (may not exist)."""
    return recipes_dir() / "model_configs" / (name.replace("/", "__") + ".json")


def model_config(name_or_path: str):
    """A transformers config: local folder, committed testbed, a fetchable target (its
    folder once fetched, else its hub model's), shipped copy, or the hub."""
    from transformers import AutoConfig

    from ..architectures.safe_load import load_config

    if name_or_path == COMMITTED_TARGET:
        return load_config(target_path(TargetSpec(path=name_or_path)))
    name_or_path = _fetched_or_hub_id(name_or_path)
    if Path(name_or_path).is_dir():
        return load_config(name_or_path)
    shipped = shipped_config_path(name_or_path)
    if shipped.is_file():
        import json

        data = json.loads(shipped.read_text())
        return AutoConfig.for_model(data.pop("model_type"), **data)
    return load_config(name_or_path)


def _fetched_or_hub_id(name: str) -> str:
    """A fetchable target's folder once `draftzoo target get` made it, else the hub id of the
    same model (whose config draftzoo ships); any other name as it is."""
    from ..architectures.defaults import fetched_target_dir
    from ..architectures.packaged_targets import PACKAGED_TARGETS

    if name not in PACKAGED_TARGETS:
        return name
    folder = fetched_target_dir(name)
    return str(folder) if folder is not None else PACKAGED_TARGETS[name].hub_id


def meta_target(target_config, max_length: int):
    """The target as a `TargetAdapter` on the meta device (no weights), refusing rows longer
    than its context; a family's `check_on_meta` builds its drafter beside it."""
    from transformers import AutoModelForCausalLM

    from ..architectures.target import TargetError

    if target_config.max_position_embeddings < max_length:
        raise TargetError(
            f"data.max_length {max_length} exceeds the target's "
            f"max_position_embeddings {target_config.max_position_embeddings}"
        )
    with torch.device("meta"):
        return TargetAdapter(AutoModelForCausalLM.from_config(target_config))
