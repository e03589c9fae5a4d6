"""Target features for drafter training: online (in the step) or offline (safetensors shards).

Both modes go through `capture_batch`, which runs the target with hooks and casts the states to
the capture dtype, so the numbers a drafter sees are the same either way. Target logits are
never stored: `target_logits` recomputes them from the final post-norm state (HF index N) and
the target's lm_head, as SpecForge does.

Offline layout (`dir/`): `index.json` (layers in HF convention, dtype, target fingerprint, data
hash, shards with their sample ranges, token counts and sha256) and `shard-00000.safetensors`…,
each holding `hidden.<layer>` [tokens, hidden] and `offsets` [samples + 1]. Shards are written
to a temporary name and renamed, the index is rewritten atomically after each, and a restarted
capture keeps every shard whose checksum matches.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..architectures.errors import DraftzooError
from .batching import Batch, collate

logger = logging.getLogger(__name__)

CAPTURE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
INDEX_FILE = "index.json"


class CaptureError(DraftzooError, ValueError):
    """Offline features that do not belong to this target, data or layer set."""


@dataclass(frozen=True)
class CaptureConfig:
    """How target features reach the trainer."""

    mode: str = "online"  # "online": target forward inside each step; "offline": read shards
    dir: str | None = None  # offline shard folder (written by `draftzoo capture`)
    dtype: str = "bfloat16"  # dtype features are rounded to, in both modes
    shard_samples: int = 512  # samples per offline shard
    batch_size: int = 8  # rows per target forward while capturing offline

    def __post_init__(self) -> None:
        if self.mode not in ("online", "offline"):
            raise ValueError(f"capture.mode must be 'online' or 'offline', got {self.mode!r}")
        if self.mode == "offline" and not self.dir:
            raise ValueError("capture.dir is required for offline capture")
        if self.dtype not in CAPTURE_DTYPES:
            raise ValueError(f"capture.dtype must be one of {sorted(CAPTURE_DTYPES)}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return CAPTURE_DTYPES[self.dtype]


@torch.no_grad()
def capture_batch(
    adapter, batch: Batch, layers: Sequence[int], dtype: torch.dtype
) -> dict[int, torch.Tensor]:
    """Hidden states {HF index: [b, s, h]} of the target on `batch`, rounded to `dtype`."""
    out = adapter(**batch.model_inputs(), hidden_indices=layers, compute_logits=False)
    return {index: out.hidden_states[index].to(dtype) for index in layers}


def target_logits(adapter, final_hidden: torch.Tensor) -> torch.Tensor:
    """Target logits [.., vocab] (float32) from the final post-norm hidden state."""
    head = adapter.lm_head
    return head(final_hidden.to(head.weight.dtype)).float()


class OnlineFeatures:
    """Features computed by the target inside the training step."""

    def __init__(self, adapter, layers: Sequence[int], dtype: torch.dtype) -> None:
        adapter.check_layer_indices(layers)
        self.adapter, self.layers, self.dtype = adapter, tuple(layers), dtype

    def __call__(self, batch: Batch) -> dict[int, torch.Tensor]:
        return capture_batch(self.adapter, batch, self.layers, self.dtype)


def estimate_bytes(dataset, hidden_size: int, layers: Sequence[int], dtype: torch.dtype) -> int:
    """Disk space the offline features of `dataset` will take."""
    tokens = sum(len(ids) for ids in dataset["input_ids"])
    return tokens * hidden_size * len(layers) * torch.tensor([], dtype=dtype).element_size()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def capture_offline(
    adapter,
    dataset,
    layers: Sequence[int],
    out_dir: Path,
    config: CaptureConfig,
    data_hash: str,
    pad_token_id: int,
) -> dict:
    """Write the features of every dataset row into shards; resume where a run stopped.

    Returns the index. Logs the disk estimate before the first forward.
    """
    adapter.check_layer_indices(layers)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    header = {
        "layers": sorted(set(layers)),
        "layer_convention": "hf_hidden_states (index k = input to decoder layer k; N = final norm)",
        "dtype": config.dtype,
        "hidden_size": adapter.hidden_size,
        "target": adapter.fingerprint().to_dict(),
        "data_hash": data_hash,
        "shard_samples": config.shard_samples,
        "num_samples": len(dataset),
    }
    index_path = out_dir / INDEX_FILE
    shards = _shards_done(out_dir, index_path, header)
    need = estimate_bytes(dataset, adapter.hidden_size, header["layers"], config.torch_dtype)
    logger.info(
        "offline capture: %d samples, layers %s, %.2f GB on disk (%d shard(s) already done)",
        len(dataset),
        header["layers"],
        need / 1e9,
        len(shards),
    )
    first = sum(s["count"] for s in shards)
    for start in range(first, len(dataset), config.shard_samples):
        stop = min(start + config.shard_samples, len(dataset))
        tensors = _capture_range(
            adapter, dataset, start, stop, header["layers"], config, pad_token_id
        )
        shards.append(_write_shard(out_dir, len(shards), start, stop, tensors))
        _write_json_atomic(index_path, {**header, "shards": shards})
    if not shards:
        _write_json_atomic(index_path, {**header, "shards": shards})
    return {**header, "shards": shards}


def _shards_done(out_dir: Path, index_path: Path, header: dict) -> list[dict]:
    """The shards an earlier run of the same capture wrote intact, in order (up to the first
    missing or corrupt one); a capture of other data, layers or target is refused."""
    if not index_path.is_file():
        return []
    existing = json.loads(index_path.read_text())
    if {k: existing.get(k) for k in header} != header:
        raise CaptureError(
            f"{out_dir} holds a capture of other data, layers or target; use another dir"
        )
    shards = []
    for shard in existing["shards"]:
        file = out_dir / shard["file"]
        if not file.is_file() or _sha256(file) != shard["sha256"]:
            logger.warning("shard %s missing or corrupt; recapturing from it", shard["file"])
            break
        shards.append(shard)
    return shards


def _write_shard(out_dir: Path, number: int, start: int, stop: int, tensors: dict) -> dict:
    """Shard `number` (rows start..stop) written atomically; its index entry."""
    from safetensors.torch import save_file

    name = f"shard-{number:05d}.safetensors"
    tmp = out_dir / (name + ".tmp")
    save_file(tensors, str(tmp))  # no metadata: its key order varies, and so would sha256
    os.replace(tmp, out_dir / name)
    return {
        "file": name,
        "first": start,
        "count": stop - start,
        "tokens": int(tensors["offsets"][-1]),
        "sha256": _sha256(out_dir / name),
    }


def _capture_range(adapter, dataset, start, stop, layers, config, pad_token_id):
    pieces: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    lengths = []
    for lo in range(start, stop, config.batch_size):
        rows = [dataset[i] for i in range(lo, min(lo + config.batch_size, stop))]
        batch = collate(rows, pad_token_id)
        states = capture_batch(adapter, batch, layers, config.torch_dtype)
        for b, row in enumerate(rows):
            n = len(row["input_ids"])
            lengths.append(n)
            for layer in layers:
                pieces[layer].append(states[layer][b, :n].contiguous())
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    tensors = {f"hidden.{layer}": torch.cat(pieces[layer]) for layer in layers}
    tensors["offsets"] = offsets
    return tensors


class OfflineFeatures:
    """Features read from shards (memory-mapped), padded to each batch's width."""

    def __init__(self, capture_dir: Path, layers: Sequence[int]) -> None:
        self.dir = Path(capture_dir)
        index_path = self.dir / INDEX_FILE
        if not index_path.is_file():
            raise CaptureError(f"no offline capture at {self.dir} (missing {INDEX_FILE})")
        self.index = json.loads(index_path.read_text())
        missing = sorted(set(layers) - set(self.index["layers"]))
        if missing:
            raise CaptureError(
                f"{self.dir} holds layers {self.index['layers']}, not {missing}; capture again"
            )
        done = sum(s["count"] for s in self.index["shards"])
        if done != self.index["num_samples"]:
            raise CaptureError(
                f"{self.dir}: capture incomplete ({done}/{self.index['num_samples']} samples); "
                "rerun `draftzoo capture` to finish it"
            )
        self.layers = tuple(layers)
        self.dtype = CAPTURE_DTYPES[self.index["dtype"]]
        self._handles: dict[str, object] = {}

    def check(self, fingerprint, data_hash: str) -> None:
        """Refuse features of another target or dataset."""
        from ..architectures.target import TargetFingerprint

        TargetFingerprint.from_dict(self.index["target"]).require_match(
            fingerprint, what="offline capture"
        )
        if self.index["data_hash"] != data_hash:
            raise CaptureError(
                f"{self.dir} was captured from data {self.index['data_hash']}, "
                f"the recipe's data is {data_hash}"
            )

    def _open(self, name: str):
        from safetensors import safe_open

        if name not in self._handles:
            self._handles[name] = safe_open(str(self.dir / name), framework="pt")
        return self._handles[name]

    def _locate(self, index: int) -> tuple[dict, int]:
        for shard in self.index["shards"]:
            if shard["first"] <= index < shard["first"] + shard["count"]:
                return shard, index - shard["first"]
        raise CaptureError(f"sample {index} is in no shard of {self.dir}")

    def __call__(self, batch: Batch) -> dict[int, torch.Tensor]:
        b, width = batch.input_ids.shape
        out = {
            layer: torch.zeros(b, width, self.index["hidden_size"], dtype=self.dtype)
            for layer in self.layers
        }
        for row, index in enumerate(batch.indices.tolist()):
            shard, local = self._locate(index)
            handle = self._open(shard["file"])
            offsets = handle.get_slice("offsets")
            lo, hi = (int(v) for v in offsets[local : local + 2])
            for layer in self.layers:
                out[layer][row, : hi - lo] = handle.get_slice(f"hidden.{layer}")[lo:hi]
        return {layer: t.to(batch.input_ids.device) for layer, t in out.items()}
