"""Defaults and locations, each written once: the committed target, caches, zoos, speculation.

DRAFTZOO_CACHE   prepared data, testbed builds (default ~/.cache/draftzoo)
DRAFTZOO_ZOO     the user's zoo (default <cache>/zoo)
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

from .errors import TargetError

#: the target draftzoo ships and trains itself (recipes/testbed/testbed-small)
COMMITTED_TARGET = "testbed-small"
#: tokens a generation may add when nobody says how many
MAX_NEW_TOKENS = 128
#: 0 = greedy decoding
TEMPERATURE = 0.0
#: the dtypes a target (and the drafter that follows it) may be loaded in
TARGET_DTYPE_NAMES = ("float32", "bfloat16", "float16")
#: draft tokens per round of a fixed-length chain when nothing else is published
NUM_SPECULATIVE_TOKENS = 4
#: positions a static KV cache holds (prompt and new tokens) when nobody says how many
MAX_CACHE_LENGTH = 2048
#: the losslessness certificate: sampled decodes per prompt, and prompts (eval/certificate.py)
CERTIFICATE_SAMPLES = 4000
CERTIFICATE_PROMPTS = 4
#: tokens an answer may have when `draftzoo regenerate` rewrites the assistant turns
ANSWER_MAX_NEW_TOKENS = 512


def recipes_dir() -> Path:
    """The installed `recipes/` folder (`draftzoo.recipes`)."""
    return Path(str(files("draftzoo.recipes")))


def committed_target_dir() -> Path:
    """The trained `testbed-small` folder shipped with draftzoo."""
    return recipes_dir() / "testbed" / COMMITTED_TARGET


def target_location(name_or_path: str | Path) -> str:
    """A folder or hub name; `testbed-small` is the target shipped with draftzoo, and a
    fetchable target's name (`smollm2-135m-instruct`) is its folder once `draftzoo target get`
    made it. A path written as one (absolute, or starting with `.` or `~`) must exist."""
    name = str(name_or_path)
    if name == COMMITTED_TARGET:
        return str(committed_target_dir())
    from .packaged_targets import PACKAGED_TARGETS

    if name in PACKAGED_TARGETS:
        folder = fetched_target_dir(name)
        if folder is None:
            raise TargetError(
                f"the target {name} is not fetched yet: run `draftzoo target get {name}` "
                f"(or name it {PACKAGED_TARGETS[name].hub_id} where a model hub is reachable)"
            )
        return str(folder)
    if name.startswith(("/", ".", "~")) and not Path(name).expanduser().exists():
        raise TargetError(f"target not found: {name}")
    return str(Path(name).expanduser()) if name.startswith("~") else name


def cache_root() -> Path:
    """`$DRAFTZOO_CACHE`, else `~/.cache/draftzoo`."""
    return Path(os.environ.get("DRAFTZOO_CACHE") or Path.home() / ".cache" / "draftzoo")


def data_cache_dir() -> Path:
    """Tokenized training data."""
    return cache_root() / "data"


def testbed_cache_dir() -> Path:
    """Prepared corpora, checkpoints and built testbeds."""
    return cache_root() / "testbed"


def targets_dir() -> Path:
    """Targets `draftzoo target get` fetched and converted."""
    return cache_root() / "targets"


def fetched_target_dir(name: str) -> Path | None:
    """The converted folder of a fetched target, when `draftzoo target get` finished it."""
    from .packaged_targets import TARGET_RECORD

    folder = targets_dir() / name
    return folder if (folder / TARGET_RECORD).is_file() else None


def target_provenance(name_or_path: str | Path) -> dict | None:
    """What a target folder draftzoo converted holds (its `draftzoo-target.json`: the GGUF, its
    hash, the package it came from, how it was dequantized); None for any other target."""
    import json

    from .packaged_targets import TARGET_RECORD

    try:
        record = Path(target_location(name_or_path)) / TARGET_RECORD
        return json.loads(record.read_text()) if record.is_file() else None
    except (TargetError, OSError, ValueError):
        return None


def default_zoo_dir() -> Path:
    """The user's zoo: `$DRAFTZOO_ZOO`, else `<cache>/zoo`."""
    return Path(os.environ.get("DRAFTZOO_ZOO") or cache_root() / "zoo")


def builtin_zoo_dir() -> Path:
    """The zoo shipped in the package: the measured testbed drafters."""
    return recipes_dir() / "zoo"
