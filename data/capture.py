"""Target features for drafter training: online (in the step) or offline (safetensors shards).

Both modes run the target with hooks through `states_by_sample` (each packed sample on its own,
`sample_forward.py`) and round the states through the capture format (`feature_storage.py`: a
float dtype, or FP8 with a scale per token), so the numbers a drafter sees are the same either
way. Target logits are never stored: `target_logits` recomputes them from the final post-norm
state (HF index N) and the target's lm_head, as SpecForge does.

Offline layout (`dir/`): `index.json` (layers in HF convention, dtype, bytes per token, target
fingerprint and the dtype its forwards ran in, data hash, shards with their sample ranges,
token counts and sha256) and `shard-00000.safetensors`…, each holding `hidden.<layer>`
[tokens, hidden] (and for FP8 `scale.<layer>` [tokens]) and `offsets` [samples + 1]. Shards
are written to a temporary name and renamed, the index is rewritten atomically after each, and
a restarted capture keeps every shard whose checksum matches.
"""

from __future__ import annotations

import hashlib
import json
import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..architectures.errors import DraftzooError
from ..architectures.output_folders import fresh_path, write_text_atomically
from .batching import Batch, collate
from .feature_storage import FeatureStorage
from .sample_forward import states_by_sample

logger = logging.getLogger(__name__)

INDEX_FILE = "index.json"


class CaptureError(DraftzooError, ValueError):
    """Offline features that do not belong to this target, data or layer set."""


@dataclass(frozen=True)
class CaptureConfig:
    """How target features reach the trainer."""

    mode: str = "online"  # "online": target forward inside each step; "offline": read shards
    dir: str | None = None  # offline shard folder (written by `draftzoo capture`)
    dtype: str = "bfloat16"  # storage format features are rounded to, in both modes:
    # bfloat16 | float16 | float32 | float8_e4m3 (a float32 scale per token, ~half of bfloat16)
    shard_samples: int = 512  # samples per offline shard
    batch_size: int = 8  # rows per target forward while capturing offline

    def __post_init__(self) -> None:
        if self.mode not in ("online", "offline"):
            raise ValueError(f"capture.mode must be 'online' or 'offline', got {self.mode!r}")
        if self.mode == "offline" and not self.dir:
            raise ValueError("capture.dir is required for offline capture")
        FeatureStorage(self.dtype)

    @property
    def storage(self) -> FeatureStorage:
        return FeatureStorage(self.dtype)


@torch.no_grad()
def capture_batch(
    adapter, batch: Batch, layers: Sequence[int], storage: FeatureStorage
) -> dict[int, torch.Tensor]:
    """Hidden states {HF index: [b, s, h]} of the target on `batch`, each sample run on its own
    (`sample_forward.py`), rounded through `storage`."""
    states = states_by_sample(adapter, batch, layers)
    return {index: storage.round(states[index]) for index in layers}


def target_head_logits(adapter, final_hidden: torch.Tensor) -> torch.Tensor:
    """Target logits [.., vocab] from the final post-norm hidden state, as the target returns
    them (`TargetAdapter.finish_logits` of its head's output), in the head's compute dtype."""
    return adapter.finish_logits(head_output(adapter, final_hidden))


def head_output(adapter, final_hidden: torch.Tensor) -> torch.Tensor:
    """The target's head [.., vocab] over states, in the head's compute dtype (bfloat16 under
    bfloat16 autocast). A frozen plain head's weight is cast to the autocast dtype once and
    kept while it is unchanged: autocast casts a weight that needs no gradient again at every
    call (68 ms for SmolLM2's head on two cores), and losses read the head a chunk of rows at
    a time. The values are autocast's own."""
    head = adapter.lm_head
    device = final_hidden.device.type
    frozen = type(head) is torch.nn.Linear and not head.weight.requires_grad
    if not (frozen and torch.is_autocast_enabled(device)):
        return head(final_hidden.to(head.weight.dtype))
    dtype = torch.get_autocast_dtype(device)
    bias = None if head.bias is None else _cast_once(head.bias, dtype)
    return torch.nn.functional.linear(final_hidden.to(dtype), _cast_once(head.weight, dtype), bias)


_CASTS: dict[int, tuple] = {}  # id(tensor) -> (weakref to it, its version, dtype, the cast)


def _cast_once(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`tensor.to(dtype)`, kept until `tensor` changes in place (its version counter moves)."""
    kept = _CASTS.get(id(tensor))
    if kept is None or kept[0]() is not tensor or kept[1:3] != (tensor._version, dtype):
        for key in [k for k, v in _CASTS.items() if v[0]() is None]:
            del _CASTS[key]
        kept = (weakref.ref(tensor), tensor._version, dtype, tensor.detach().to(dtype))
        _CASTS[id(tensor)] = kept
    return kept[3]


def target_logits(adapter, final_hidden: torch.Tensor) -> torch.Tensor:
    """Target logits [.., vocab] (float32) from the final post-norm hidden state."""
    return target_head_logits(adapter, final_hidden).float()


class OnlineFeatures:
    """Features computed by the target inside the training step."""

    def __init__(self, adapter, layers: Sequence[int], storage: str) -> None:
        adapter.check_layer_indices(layers)
        self.adapter, self.layers = adapter, tuple(layers)
        self.storage = FeatureStorage(storage)

    def __call__(self, batch: Batch) -> dict[int, torch.Tensor]:
        return capture_batch(self.adapter, batch, self.layers, self.storage)


def estimate_bytes(dataset, hidden_size: int, layers: Sequence[int], storage: str) -> int:
    """Disk space the offline features of `dataset` will take in format `storage`."""
    tokens = sum(len(ids) for ids in dataset["input_ids"])
    return tokens * FeatureStorage(storage).bytes_per_token(hidden_size, layers)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_json_atomic(path: Path, data: dict) -> None:
    write_text_atomically(path, json.dumps(data, indent=1))


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
    _claim_capture_dir(out_dir)
    header = {
        "layers": sorted(set(layers)),
        "layer_convention": "hf_hidden_states (index k = input to decoder layer k; N = final norm)",
        "dtype": config.dtype,
        "bytes_per_token": config.storage.bytes_per_token(adapter.hidden_size, sorted(set(layers))),
        "hidden_size": adapter.hidden_size,
        "target": adapter.fingerprint().to_dict(),
        #: the weights' dtype in the forwards that produced the states
        "target_dtype": str(next(adapter.model.parameters()).dtype).removeprefix("torch."),
        "data_hash": data_hash,
        "shard_samples": config.shard_samples,
        "num_samples": len(dataset),
    }
    index_path = out_dir / INDEX_FILE
    shards = _shards_done(out_dir, index_path, header)
    if not shards:  # the index claims the folder before any shard is in it
        _write_json_atomic(index_path, {**header, "shards": shards})
    need = estimate_bytes(dataset, adapter.hidden_size, header["layers"], config.dtype)
    logger.info(
        "offline capture: %d samples, layers %s, %s, %d bytes per token, %.2f GB on disk "
        "(%d shard(s) already done)",
        len(dataset),
        header["layers"],
        config.dtype,
        header["bytes_per_token"],
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
    return {**header, "shards": shards}


def _claim_capture_dir(out_dir: Path) -> None:
    """A capture writes into a new or empty folder, or one an earlier capture claimed with its
    index; never through a symbolic link or among files it did not write."""
    if out_dir.is_symlink() or (out_dir / INDEX_FILE).is_symlink():
        raise CaptureError(f"{out_dir}: a symbolic link; name the capture folder itself")
    if out_dir.exists() and not out_dir.is_dir():
        raise CaptureError(f"{out_dir} is a file, not a capture folder")
    if out_dir.is_dir() and not (out_dir / INDEX_FILE).is_file() and any(out_dir.iterdir()):
        raise CaptureError(
            f"{out_dir} holds files no capture wrote (no {INDEX_FILE}); name a new or empty folder"
        )
    out_dir.mkdir(parents=True, exist_ok=True)


def _shards_done(out_dir: Path, index_path: Path, header: dict) -> list[dict]:
    """The shards an earlier run of the same capture wrote intact, in order (up to the first
    missing or corrupt one); a capture of other data, layers or target is refused."""
    if not index_path.is_file():
        return []
    existing = json.loads(index_path.read_text())
    identity = {k: v for k, v in header.items() if k != "bytes_per_token"}  # derived
    if "target_dtype" not in existing:  # an index written before the dtype was recorded
        identity.pop("target_dtype")
    if {k: existing.get(k) for k in identity} != identity:
        raise CaptureError(
            f"{out_dir} holds a capture of other data, layers or target (or of the target in "
            "another dtype); use another dir"
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
    with fresh_path(out_dir / name) as tmp:
        save_file(tensors, str(tmp))  # no metadata: its key order varies, and so would sha256
    return {
        "file": name,
        "first": start,
        "count": stop - start,
        "tokens": int(tensors["offsets"][-1]),
        "sha256": _sha256(out_dir / name),
    }


def _capture_range(adapter, dataset, start, stop, layers, config, pad_token_id):
    storage = config.storage
    pieces: dict[str, list[torch.Tensor]] = {}
    lengths = []
    for lo in range(start, stop, config.batch_size):
        rows = [dataset[i] for i in range(lo, min(lo + config.batch_size, stop))]
        states = states_by_sample(adapter, collate(rows, pad_token_id), layers)
        for b, row in enumerate(rows):
            n = len(row["input_ids"])
            lengths.append(n)
            for layer in layers:
                encoded = storage.encode(states[layer][b, :n])
                for part, tensor in encoded.items():
                    pieces.setdefault(f"{part}.{layer}", []).append(tensor.contiguous())
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    tensors = {key: torch.cat(parts) for key, parts in pieces.items()}
    tensors["offsets"] = offsets
    return tensors


class OfflineFeatures:
    """Features read from shards (memory-mapped), padded to each batch's width."""

    def __init__(
        self, capture_dir: Path, layers: Sequence[int], rows_read: int | None = None
    ) -> None:
        """`rows_read`: the run reads the first that many samples only (`train.rows`), so a
        capture still under way serves it once its shards cover them; None: every sample."""
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
        done = sum(s["count"] for s in self.index["shards"])  # shards cover a prefix
        total = self.index["num_samples"]
        needed = total if rows_read is None else min(rows_read, total)
        if done < needed:
            reads = "" if rows_read is None else f"; this run reads the first {needed}"
            raise CaptureError(
                f"{self.dir}: capture incomplete ({done}/{total} samples{reads}); "
                "rerun `draftzoo capture` to finish it"
            )
        self.layers = tuple(layers)
        self.storage = FeatureStorage(self.index["dtype"])
        self._handles: dict[str, object] = {}
        for shard in self.index["shards"]:  # every shard's format, before the first step
            self._open(shard["file"])

    def check(self, fingerprint, data_hash: str, storage: str) -> None:
        """Refuse features of another target, dataset or storage format than the recipe's."""
        from ..architectures.target import TargetFingerprint

        if self.storage.name != storage:
            raise CaptureError(
                f"{self.dir} holds {self.storage.name} states, the recipe's capture.dtype is "
                f"{storage}; set capture.dtype={self.storage.name} or capture again"
            )

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
            handle = safe_open(str(self.dir / name), framework="pt")
            self.storage.check_shard(handle, name, self.layers)
            self._handles[name] = handle
        return self._handles[name]

    def _locate(self, index: int) -> tuple[dict, int]:
        for shard in self.index["shards"]:
            if shard["first"] <= index < shard["first"] + shard["count"]:
                return shard, index - shard["first"]
        raise CaptureError(f"sample {index} is in no shard of {self.dir}")

    def __call__(self, batch: Batch) -> dict[int, torch.Tensor]:
        b, width = batch.input_ids.shape
        out = {
            layer: torch.zeros(b, width, self.index["hidden_size"], dtype=self.storage.read_dtype)
            for layer in self.layers
        }
        for row, index in enumerate(batch.indices.tolist()):
            shard, local = self._locate(index)
            handle = self._open(shard["file"])
            offsets = handle.get_slice("offsets")
            lo, hi = (int(v) for v in offsets[local : local + 2])
            for layer in self.layers:
                scale = handle.get_slice(f"scale.{layer}")[lo:hi] if self.storage.is_fp8 else None
                hidden = handle.get_slice(f"hidden.{layer}")[lo:hi]
                out[layer][row, : hi - lo] = self.storage.decode(hidden, scale)
        return {layer: t.to(batch.input_ids.device) for layer, t in out.items()}
