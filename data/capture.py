"""Target features for drafter training: online (in the step) or offline (safetensors shards).

Both modes run the target with hooks through `states_by_sample` (each packed sample on its own,
`sample_forward.py`) and round the states through the capture format (`feature_storage.py`: a
float dtype, or FP8 with a scale per token), so the numbers a drafter sees are the same either
way. Target logits are never stored (`target_head.py` recomputes them from the final state);
where the final state is captured, an offline capture keeps what a draft-vocabulary loss reads
of the whole vocabulary, the argmax and log-normaliser of each token's logits from the state
as stored (`capture.teacher_reads`): the trainer then projects only the kept rows of the head.

Offline layout (`dir/`): `index.json` (layers in HF convention, dtype, bytes per token, target
fingerprint and the dtype its forwards ran in, data hash, whether it keeps the reads, shards
with their sample ranges, token counts and sha256) and `shard-00000.safetensors`…, each
holding `hidden.<layer>` [tokens, hidden] (and for FP8 `scale.<layer>` [tokens]), `offsets`
[samples + 1] and with the reads `teacher.argmax` and `teacher.log_norm` [tokens]. Shards are
written to a temporary name and renamed, the index is rewritten atomically after each, and a
restarted capture keeps every shard whose checksum matches; it goes on in the format it began
with (an index from before the reads were kept holds none).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..architectures.errors import DraftzooError
from ..architectures.output_folders import fresh_path, write_text_atomically
from .batching import Batch, collate
from .feature_storage import FeatureStorage
from .sample_forward import states_by_sample
from .target_head import TEACHER_ARGMAX, TEACHER_LOG_NORM, whole_vocab_reads

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
    #: offline, where the final state is captured: keep each token's argmax and log-normaliser
    #: over the whole vocabulary (8 bytes), so EAGLE-3's loss projects only its draft
    #: vocabulary's rows of the head (one projection per token here, not one per pass)
    teacher_reads: bool = True

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


class OnlineFeatures:
    """Features computed by the target inside the training step."""

    def __init__(self, adapter, layers: Sequence[int], storage: str) -> None:
        adapter.check_layer_indices(layers)
        self.adapter, self.layers = adapter, tuple(layers)
        self.storage = FeatureStorage(storage)

    def __call__(self, batch: Batch) -> dict[int, torch.Tensor]:
        return capture_batch(self.adapter, batch, self.layers, self.storage)


#: bytes a token's reads take (`capture.teacher_reads`): an int32 argmax, a float32 normaliser
READS_BYTES = 8


def keeps_reads(config: CaptureConfig, num_layers: int, layers: Sequence[int]) -> bool:
    """Whether an offline capture of `layers` keeps the target's reads: asked, and the final
    state (HF index `num_layers`) among them."""
    return config.teacher_reads and num_layers in layers


def estimate_bytes(
    dataset, hidden_size: int, layers: Sequence[int], storage: str, reads: bool = False
) -> int:
    """Disk space the offline features of `dataset` will take in format `storage` (with the
    target's reads where `reads`)."""
    tokens = sum(len(ids) for ids in dataset["input_ids"])
    per_token = FeatureStorage(storage).bytes_per_token(hidden_size, layers)
    return tokens * (per_token + READS_BYTES * reads)


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
    reads = keeps_reads(config, adapter.num_layers, layers)
    header = {
        "layers": sorted(set(layers)),
        "layer_convention": "hf_hidden_states (index k = input to decoder layer k; N = final norm)",
        "dtype": config.dtype,
        "bytes_per_token": config.storage.bytes_per_token(adapter.hidden_size, sorted(set(layers)))
        + READS_BYTES * reads,
        "hidden_size": adapter.hidden_size,
        "target": adapter.fingerprint().to_dict(),
        #: the weights' dtype in the forwards that produced the states
        "target_dtype": str(next(adapter.model.parameters()).dtype).removeprefix("torch."),
        "data_hash": data_hash,
        "shard_samples": config.shard_samples,
        "num_samples": len(dataset),
        "teacher_reads": reads,
    }
    index_path = out_dir / INDEX_FILE
    shards = _shards_done(out_dir, index_path, header)
    if not shards:  # the index claims the folder before any shard is in it
        _write_json_atomic(index_path, {**header, "shards": shards})
    need = estimate_bytes(
        dataset, adapter.hidden_size, header["layers"], config.dtype, header["teacher_reads"]
    )
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
        reads = header["teacher_reads"]
        tensors = _capture_range(
            adapter, dataset, start, stop, header["layers"], config, pad_token_id, reads
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
    reads = identity.pop("teacher_reads")
    if {k: existing.get(k) for k in identity} != identity:
        raise CaptureError(
            f"{out_dir} holds a capture of other data, layers or target (or of the target in "
            "another dtype); use another dir"
        )
    kept = existing.get("teacher_reads", False)  # an index from before reads were kept: none
    if kept != reads:
        raise CaptureError(
            f"{out_dir} holds a capture {'with' if kept else 'without'} the target's reads; "
            f"set capture.teacher_reads={str(kept).lower()} to finish it, or use another dir"
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


def _capture_range(adapter, dataset, start, stop, layers, config, pad_token_id, reads: bool):
    """The tensors of one shard: rows start..stop's states in the storage format, their
    offsets, and with `reads` the target's reads from the final states as stored."""
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
                if reads and layer == adapter.num_layers:  # what a trainer reads back
                    stored = storage.decode(**encoded)
                    for key, tensor in whole_vocab_reads(adapter, stored).items():
                        pieces.setdefault(key, []).append(tensor)
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
        #: the shards keep the target's reads (`capture.teacher_reads`): each batch carries them
        self.teacher_reads = bool(self.index.get("teacher_reads", False))
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
            reads = {TEACHER_ARGMAX, TEACHER_LOG_NORM}
            if self.teacher_reads and not reads <= set(handle.keys()):
                raise CaptureError(f"{name} lacks the reads its index names; capture again")
            self._handles[name] = handle
        return self._handles[name]

    def _locate(self, index: int) -> tuple[dict, int]:
        for shard in self.index["shards"]:
            if shard["first"] <= index < shard["first"] + shard["count"]:
                return shard, index - shard["first"]
        raise CaptureError(f"sample {index} is in no shard of {self.dir}")

    def __call__(self, batch: Batch) -> dict[int | str, torch.Tensor]:
        """{HF index: [b, s, h] states} of `batch`'s rows, zero-padded; with the target's reads
        also {TEACHER_ARGMAX: [b, s] long, TEACHER_LOG_NORM: [b, s] float32}."""
        b, width = batch.input_ids.shape
        out: dict[int | str, torch.Tensor] = {
            layer: torch.zeros(b, width, self.index["hidden_size"], dtype=self.storage.read_dtype)
            for layer in self.layers
        }
        if self.teacher_reads:
            out[TEACHER_ARGMAX] = torch.zeros(b, width, dtype=torch.long)
            out[TEACHER_LOG_NORM] = torch.zeros(b, width, dtype=torch.float32)
        for row, index in enumerate(batch.indices.tolist()):
            shard, local = self._locate(index)
            handle = self._open(shard["file"])
            offsets = handle.get_slice("offsets")
            lo, hi = (int(v) for v in offsets[local : local + 2])
            for layer in self.layers:
                scale = handle.get_slice(f"scale.{layer}")[lo:hi] if self.storage.is_fp8 else None
                hidden = handle.get_slice(f"hidden.{layer}")[lo:hi]
                out[layer][row, : hi - lo] = self.storage.decode(hidden, scale)
            if self.teacher_reads:
                for key in (TEACHER_ARGMAX, TEACHER_LOG_NORM):
                    out[key][row, : hi - lo] = handle.get_slice(key)[lo:hi]
        return {key: t.to(batch.input_ids.device) for key, t in out.items()}
