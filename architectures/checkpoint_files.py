"""Tensors of a transformers checkpoint folder, read by key without building the model.

Single-file (`model.safetensors`) and sharded (`model.safetensors.index.json`) checkpoints;
only safetensors are read. A hub name is fetched into the local hub cache first.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .errors import DraftzooError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class CheckpointError(DraftzooError, ValueError):
    """A checkpoint folder without the safetensors files or the tensor asked for."""


def local_folder(name_or_path: Path | str) -> Path:
    """A checkpoint folder on disk: as given, or a hub snapshot of its weights and config."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(name_or_path), allow_patterns=["*.safetensors", "*.json"]))


def checkpoint_files(folder: Path) -> dict[str, Path]:
    """{tensor key: safetensors file} of a checkpoint folder (single file or sharded)."""
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {key: folder / name for key, name in weight_map.items()}
    single = folder / SINGLE_FILE
    if not single.is_file():
        raise CheckpointError(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE}")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as handle:
        return dict.fromkeys(handle.keys(), single)


def read_tensor(folder: Path, key: str) -> torch.Tensor:
    """One tensor of the checkpoint in `folder`, as stored (dtype unchanged)."""
    from safetensors import safe_open

    files = checkpoint_files(folder)
    if key not in files:
        raise CheckpointError(f"{folder}: the checkpoint has no tensor {key!r}")
    with safe_open(str(files[key]), framework="pt") as handle:
        return handle.get_tensor(key)


def input_embedding_key(folder: Path) -> str:
    """The checkpoint key of the model's input embedding (`model.embed_tokens.weight` for
    Llama, Qwen, Mistral), found by building the model on the meta device."""
    from transformers import AutoModelForCausalLM

    from .safe_load import load_config

    config = load_config(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    embedding = model.get_input_embeddings()
    name = next(n for n, module in model.named_modules() if module is embedding)
    key = f"{name}.weight"
    keys = checkpoint_files(folder)
    if key in keys:
        return key
    endings = [k for k in keys if k.endswith(f".{name.rsplit('.', 1)[-1]}.weight")]
    if len(endings) == 1:
        return endings[0]
    raise CheckpointError(f"{folder}: no checkpoint tensor holds the input embedding ({key})")


def input_embedding(name_or_path: Path | str) -> torch.Tensor:
    """The target's input embedding matrix [vocab, hidden], as its checkpoint stores it."""
    folder = local_folder(name_or_path)
    return read_tensor(folder, input_embedding_key(folder))
