"""Saving and checking drafter folders: `config.json`, `model.safetensors`, `draftzoo.json`.

`draftzoo.json` records the family, the target fingerprint (architecture, hidden size, layer
count, vocabulary size, tokenizer hash), the hidden-state layers the drafter reads (HF
convention), the recipe and the data hash. A folder appears whole or not at all: it is written
under a temporary name and renamed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from .errors import DraftzooError
from .target import TargetFingerprint

RECORD_FILE = "draftzoo.json"
WEIGHTS_FILE = "model.safetensors"
RECORD_VERSION = 1
#: the files that define a drafter; its checkpoint hash covers exactly these
DEFINING_FILES = ("config.json", "model.safetensors", RECORD_FILE)


class DrafterError(DraftzooError, ValueError):
    """A folder that is not a drafter, or a drafter record that cannot be read."""


def save_drafter(
    model,
    output_dir: Path,
    family: str,
    target: TargetFingerprint,
    recipe: dict[str, Any],
    data_hash: str,
    layers: list[int] | None = None,
    tokenizer=None,
    extra: dict[str, Any] | None = None,
    state_dict: dict[str, Any] | None = None,
) -> Path:
    """Write the drafter alone (weights + config + record) to `output_dir`, atomically."""
    output_dir = output_path(output_dir)
    tmp = output_dir.with_name(output_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    record = {
        "version": RECORD_VERSION,
        "family": family,
        "target": target.to_dict(),
        "hidden_state_layers": layers or [],
        "layer_convention": "hf_hidden_states (index k = input to decoder layer k; N = final norm)",
        "recipe": recipe,
        "data_hash": data_hash,
        **(extra or {}),
    }
    (tmp / RECORD_FILE).write_text(json.dumps(record, indent=1))
    return replace_dir(tmp, output_dir)


class OutputDirError(DraftzooError, ValueError):
    """An output folder that holds files draftzoo did not write (it would be replaced whole)."""


def output_path(output_dir: Path | str) -> Path:
    """The folder a command writes, as given; `.`, `..` and the like resolved to their name."""
    output_dir = Path(output_dir)
    return output_dir.resolve() if output_dir.name in ("", ".", "..") else output_dir


def check_replaceable(output_dir: Path) -> None:
    """An output folder draftzoo may replace whole: absent, empty, or one it wrote (a drafter
    with its `draftzoo.json`, or an export whose `config.json` carries a `draftzoo` entry)."""
    output_dir = Path(output_dir)
    if not output_dir.exists():
        return
    if not output_dir.is_dir():
        raise OutputDirError(f"{output_dir} is a file; name a folder to write into")
    if not any(output_dir.iterdir()) or (output_dir / RECORD_FILE).is_file():
        return
    if not is_marked_export(output_dir):
        raise OutputDirError(
            f"{output_dir} already holds files draftzoo did not write, and the output folder is "
            "replaced whole; name a new folder"
        )


def is_marked_export(folder: Path) -> bool:
    """Whether `folder` holds an export draftzoo wrote: a `config.json` with a `draftzoo`
    entry (every exporter writes one)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "draftzoo" in config


def replace_dir(tmp: Path, output_dir: Path) -> Path:
    """Move the finished folder `tmp` to `output_dir`, replacing any old one whole (only one
    that `check_replaceable` allows)."""
    check_replaceable(output_dir)
    if output_dir.exists():
        old = output_dir.with_name(output_dir.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(output_dir, old)
        os.replace(tmp, output_dir)
        shutil.rmtree(old)
    else:
        os.replace(tmp, output_dir)
    return output_dir


def write_drafter_files(path: Path, config: dict[str, Any], tensors: dict) -> None:
    """A drafter module's own files: `config.json` and its tensors in `model.safetensors`."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=1, default=str))
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})


def read_drafter_weights(path: Path) -> dict:
    """The tensors of a drafter folder's `model.safetensors` (never a pickle)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = Path(path) / WEIGHTS_FILE
    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as err:
        raise DrafterError(f"{file} cannot be read: {err}") from err


def read_drafter_record(path: Path) -> dict[str, Any]:
    """The `draftzoo.json` of a drafter folder."""
    file = Path(path) / RECORD_FILE
    if not file.is_file():
        raise DrafterError(f"{path} is not a draftzoo drafter (no {RECORD_FILE})")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise DrafterError(f"{file} is not valid JSON: {err}") from err


def check_drafter_target(
    path: Path, target: TargetFingerprint, record: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The drafter's record (read from `path` unless given), after refusing a target it was
    not built for."""
    record = read_drafter_record(path) if record is None else record
    TargetFingerprint.from_dict(record["target"]).require_match(target, what=f"drafter {path}")
    return record


def defining_files(path: Path) -> tuple[str, ...]:
    """The files (relative paths) that define the drafter in `path`: `DEFINING_FILES`, and
    the adapter's files for a family that ships one."""
    from .families import family_spec
    from .lora_adapter import ADAPTER_DIR, ADAPTER_FILES

    if family_spec(read_drafter_record(path)["family"]).adapts_target:
        return (*DEFINING_FILES, *(f"{ADAPTER_DIR}/{name}" for name in ADAPTER_FILES))
    return DEFINING_FILES


def checkpoint_hash(path: Path) -> str:
    """sha256 over the drafter's defining files (name + content), hex."""
    path = Path(path)
    digest = hashlib.sha256()
    for name in defining_files(path):
        file = path / name
        if not file.is_file():
            raise DrafterError(f"{path} is not a complete drafter: {name} is missing")
        digest.update(name.encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
