"""Saving and checking drafter folders: `config.json`, `model.safetensors`, `draftzoo.json`.

`draftzoo.json` records the family, the target fingerprint (architecture, hidden size, layer
count, vocabulary size, tokenizer hash), the hidden-state layers the drafter reads (HF
convention), the recipe and the data hash. A folder appears whole or not at all: it is written
under a temporary name and renamed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from .errors import DraftzooError
from .output_folders import (  # noqa: F401  (the folder rule's names, re-exported)
    RECORD_FILE,
    OutputDirError,
    check_replaceable,
    interrupted_swap,
    is_marked_export,
    open_own_file,
    output_path,
    replace_dir,
    scratch_dir,
)
from .target import TargetFingerprint

WEIGHTS_FILE = "model.safetensors"
RECORD_VERSION = 1
#: the files that define a drafter; its checkpoint hash covers exactly these
DEFINING_FILES = ("config.json", "model.safetensors", RECORD_FILE)
#: a draft LM's draft vocabulary map (`d2t`, `t2d`), beside its stock transformers weights;
#: defining where the record's `draft_vocab_file` names it
DRAFT_VOCAB_FILE = "draft_vocab.safetensors"


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
    inputs: tuple[Path | str, ...] = (),
    files: dict[str, bytes] | None = None,
) -> Path:
    """Write the drafter alone (weights + config + record, and `files` {name: bytes}) to
    `output_dir`, atomically (`inputs`: what the run read, which the output may not
    replace)."""
    output_dir = output_path(output_dir)
    check_replaceable(output_dir, inputs)  # before anything is written
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
    tmp = scratch_dir(output_dir, "tmp")
    try:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, data in (files or {}).items():
            (tmp / name).write_bytes(data)
        (tmp / RECORD_FILE).write_text(json.dumps(record, indent=1))
        return replace_dir(tmp, output_dir, inputs)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # the scratch folder is this call's own
        raise


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
    return _checked_record(_json_object(file), file)


def parse_record(data: bytes, file: Path) -> dict[str, Any]:
    """A `draftzoo.json` read as `data` (from `file`)."""
    try:
        record = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DrafterError(f"{file} is not valid JSON: {err}") from err
    if not isinstance(record, dict):
        raise DrafterError(f"{file} is not a JSON object")
    return _checked_record(record, file)


def _checked_record(record: dict[str, Any], file: Path) -> dict[str, Any]:
    if not isinstance(record.get("family"), str):
        raise DrafterError(f"{file} is not a drafter record (a JSON object naming its family)")
    return record


def read_drafter_config(path: Path) -> dict[str, Any]:
    """The `config.json` of a drafter folder (a JSON object)."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise DrafterError(f"{path} has no config.json")
    return _json_object(file)


def _json_object(file: Path) -> dict[str, Any]:
    try:
        with open_own_file(file, DrafterError) as handle:
            data = json.loads(handle.read())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise DrafterError(f"{file} is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise DrafterError(f"{file} is not a JSON object")
    return data


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
    return defining_names(read_drafter_record(path))


def defining_names(record: dict[str, Any]) -> tuple[str, ...]:
    """The files that define a drafter with this record (`defining_files`)."""
    from .families import UnknownFamilyError, family_spec
    from .lora_adapter import ADAPTER_DIR, ADAPTER_FILES

    try:
        adapts = family_spec(record["family"]).adapts_target
    except UnknownFamilyError:
        adapts = False  # refused by whoever asks its family, in their words
    names = DEFINING_FILES
    if adapts:
        names = (*names, *(f"{ADAPTER_DIR}/{name}" for name in ADAPTER_FILES))
    vocab_file = record.get("draft_vocab_file")
    if vocab_file is not None:
        if vocab_file != DRAFT_VOCAB_FILE:
            raise DrafterError(
                f"the record's draft_vocab_file must be {DRAFT_VOCAB_FILE!r}, got {vocab_file!r}"
            )
        names = (*names, DRAFT_VOCAB_FILE)
    return names


def checkpoint_hash(path: Path) -> str:
    """sha256 over the drafter's defining files (name + content), hex."""
    path = Path(path)
    digest = hashlib.sha256()
    for name in defining_files(path):
        file = path / name
        if not file.is_file():
            raise DrafterError(f"{path} is not a complete drafter: {name} is missing")
        digest.update(name.encode() + b"\0")
        with open_own_file(file, DrafterError) as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
