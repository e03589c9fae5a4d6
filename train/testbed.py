"""The testbed recipe, top to bottom: prepare data -> pretrain the target -> write its record.

Run it as `draftzoo testbed build --size small` (one process) or, to use both CPU cores through
DDP, `ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 -m draftzoo.cli
testbed build --size small`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..architectures import defaults
from ..architectures.config_io import load_yaml_config, to_dict
from ..architectures.errors import DraftzooError
from ..architectures.output_folders import write_text_atomically
from .distributed import partial_state
from .pretrain_lm import pretrain
from .testbed_config import TestbedConfig
from .testbed_data import prepare_testbed_data

logger = logging.getLogger(__name__)

TESTBED_SIZES = ("tiny", "small")
RECORD_FILE = "testbed.json"


class TestbedError(DraftzooError, ValueError):
    """A testbed that does not exist or cannot be built."""

    __test__ = False


def recipe_path(size: str) -> Path:
    """The YAML recipe of a testbed size."""
    if size not in TESTBED_SIZES:
        raise TestbedError(
            f"unknown testbed size {size!r}; known sizes: {', '.join(TESTBED_SIZES)}"
        )
    return defaults.recipes_dir() / "testbed" / f"testbed-{size}.yaml"


committed_testbed_dir = defaults.committed_target_dir
default_cache_dir = defaults.testbed_cache_dir


def build_testbed(config: TestbedConfig, output_dir: Path, cache_dir: Path | None = None) -> dict:
    """Prepare data, pretrain and save the target to `output_dir`; return its record."""
    cache_dir = Path(cache_dir or default_cache_dir())
    state = partial_state()
    with state.main_process_first():
        data = prepare_testbed_data(config, cache_dir)
    work_dir = cache_dir / "runs" / config.name
    result = pretrain(config, data, work_dir, Path(output_dir))
    manifest = data.read_manifest()
    record = {
        "name": config.name,
        "parameters": result.parameters,
        "training_steps": result.steps,
        "training_tokens": result.train_tokens_seen,
        "train_seconds": round(result.train_seconds, 1),
        "mixed_precision": result.mixed_precision,
        "processes": state.num_processes,
        "heldout_loss": round(result.heldout_loss, 4),
        "unigram_loss": round(result.unigram_loss, 4),
        "loss_ratio": round(result.loss_ratio, 4),
        "corpus": {
            "train_tokens": manifest["train"]["tokens"],
            "heldout_tokens": manifest["heldout"]["tokens"],
            "train_files": manifest["train"]["files"],
            "heldout_files": manifest["heldout"]["files"],
            "chat_pairs": manifest["train"]["chat_pairs"],
            "files_hash": manifest["corpus_files_hash"],
            "versions": manifest["versions"],
            "heldout_modules": manifest["heldout_modules"],
        },
        "recipe": to_dict(config),
    }
    if state.is_main_process:
        write_record(Path(output_dir), record)
    return record


def write_record(output_dir: Path, record: dict) -> None:
    """Write `testbed.json` atomically."""
    write_text_atomically(output_dir / RECORD_FILE, json.dumps(record, indent=2) + "\n")


def read_record(testbed_dir: Path) -> dict:
    """The record of a built testbed, or a clear error."""
    path = Path(testbed_dir) / RECORD_FILE
    if not path.is_file():
        raise TestbedError(f"{testbed_dir} is not a built testbed ({RECORD_FILE} missing)")
    return json.loads(path.read_text())


def load_testbed_config(size_or_path: str) -> TestbedConfig:
    """A testbed recipe by size name ("tiny", "small") or YAML path."""
    path = Path(size_or_path)
    if path.suffix in (".yaml", ".yml"):
        return load_yaml_config(TestbedConfig, path)
    return load_yaml_config(TestbedConfig, recipe_path(size_or_path))
