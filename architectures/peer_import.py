"""Drafters in the peers' published layouts -> draftzoo drafter folders.

    draftzoo import PEER_FOLDER --output-dir runs/imported [--target TARGET]
    draftzoo eval PEER_FOLDER ...        # converted on load (inference/peer_import.py)

A family declares the layouts it reads (`FamilySpec.importers`: layout name ->
"module:function"); each function takes a `PeerFolder` and the target (`TargetAdapter`) and
returns an `Imported` — the drafter's config.json fields, its tensors in draftzoo's names, the
hidden-state layers it reads — or None when the files are not its layout. Exactly one layout
must claim a folder. The files are read as JSON and safetensors only; pickles (`*.bin`, `*.pt`)
only with `--allow-pickle`, and then with `weights_only=True`. The target is the one named
(`--target`), else the verifier the peer's config names; a config that names another verifier
than the target given is refused. inference/peer_import.py loads the converted folder with its
family's own runtime before moving it into place (the target's fingerprint, every tensor's name
and shape); its record says where it came from (`imported`: layout, source folder, the source
files' sha256).
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .drafter_io import (
    RECORD_FILE,
    RECORD_VERSION,
    write_drafter_files,
)
from .errors import DraftzooError
from .safe_load import PICKLE_PATTERNS, pickles_allowed

#: files a peer folder's weights may be in, besides the pickles `--allow-pickle` admits
SAFETENSORS_PATTERN = "*.safetensors"


class PeerImportError(DraftzooError, ValueError):
    """A peer folder that does not convert: unknown layout, missing or misshapen tensors,
    another verifier, pickles without `--allow-pickle`."""


@dataclass(frozen=True)
class PeerFolder:
    """A peer's drafter folder: its config.json, its weight files, and their tensors (read on
    first use: a conversion already in the cache needs none)."""

    path: Path
    config: Mapping[str, Any]
    files: tuple[str, ...]  # the weight files, by name

    @functools.cached_property
    def tensors(self) -> dict[str, torch.Tensor]:
        tensors: dict[str, torch.Tensor] = {}
        for name in self.files:
            tensors.update(_read_weights(self.path / name))
        return tensors

    @property
    def keys(self) -> set[str]:
        return set(self.tensors)

    def architectures(self) -> list[str]:
        """The config's `architectures` (an empty list when it names none)."""
        names = self.config.get("architectures") or []
        return [str(n) for n in names] if isinstance(names, list) else []


@dataclass(frozen=True)
class Imported:
    """A peer folder in draftzoo's terms (what a family's importer returns)."""

    family: str
    layout: str  # how the peer calls the layout ("speculators Eagle3Speculator")
    config: dict[str, Any]  # the drafter's config.json
    tensors: dict[str, torch.Tensor]  # in draftzoo's names
    layers: list[int]  # hidden-state layers it reads (HF indices)
    verifier: str | None = None  # the target the peer's config names, if it names one
    notes: tuple[str, ...] = ()  # what the conversion dropped or assumed, said on import
    copy_files: tuple[str, ...] = field(default=())  # files copied as they are (tokenizer)


def read_peer_folder(path: Path) -> PeerFolder:
    """A peer folder's config.json and weight files; pickled weights only when allowed."""
    path = Path(path)
    if not path.is_dir():
        raise PeerImportError(f"{path} is not a folder")
    linked = sorted(p.name for p in path.iterdir() if p.is_symlink())
    if linked:  # read, a link would bring whatever it points to into the imported drafter
        raise PeerImportError(f"{path / linked[0]} is a symbolic link; import reads only files")
    config: dict[str, Any] = {}
    if (path / "config.json").is_file():
        try:
            config = json.loads((path / "config.json").read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
            raise PeerImportError(f"{path}/config.json is not valid JSON: {err}") from err
        if not isinstance(config, dict):
            raise PeerImportError(f"{path}/config.json is not a JSON object")
    safetensors = sorted(p for p in path.glob(SAFETENSORS_PATTERN) if p.is_file())
    pickles = sorted(p for pattern in PICKLE_PATTERNS for p in path.glob(pattern) if p.is_file())
    files = safetensors or pickles
    if not files:
        raise PeerImportError(f"{path} holds no weights (no *.safetensors, no pickled weights)")
    if not safetensors and not pickles_allowed():
        names = ", ".join(p.name for p in pickles)
        raise PeerImportError(
            f"{path} holds its weights only as pickles ({names}), which can run code when "
            "read; pass draftzoo --allow-pickle for files you trust"
        )
    return PeerFolder(path, config, tuple(p.name for p in files))


def _read_weights(file: Path) -> dict[str, torch.Tensor]:
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(file))
        loaded = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # the file is untrusted input
        said = " ".join(str(err).split())[:200]
        raise PeerImportError(f"{file} cannot be read as weights: {said}") from err
    if not isinstance(loaded, dict) or not all(
        isinstance(v, torch.Tensor) for v in loaded.values()
    ):
        raise PeerImportError(f"{file} is not a mapping of names to tensors")
    return dict(loaded)


#: config keys that describe the file, not the peer's decoder layer
NOT_LAYER_FIELDS = ("architectures", "model_type", "auto_map", "torch_dtype", "dtype", "draftzoo")


def layer_fields(config_class: type, fields: dict[str, Any], target) -> tuple[Any, dict[str, Any]]:
    """The peer's decoder layer read by a transformers config class, and the shape fields every
    drafter's config.json carries; a hidden size other than the target's is refused (the
    drafters here fuse the target's states at its own width)."""
    layer = config_class(**{k: v for k, v in fields.items() if k not in NOT_LAYER_FIELDS})
    hidden = layer.hidden_size
    if hidden != target.hidden_size:
        raise PeerImportError(
            f"the drafter's hidden size {hidden} differs from the target's {target.hidden_size}"
        )
    heads = layer.num_attention_heads
    return layer, {
        "hidden_size": hidden,
        "target_hidden_size": hidden,
        "intermediate_size": layer.intermediate_size,
        "num_attention_heads": heads,
        "num_key_value_heads": layer.num_key_value_heads or heads,
        "head_dim": getattr(layer, "head_dim", None) or hidden // heads,
        "hidden_act": layer.hidden_act,
        "rms_norm_eps": layer.rms_norm_eps,
        "max_position_embeddings": layer.max_position_embeddings,
        "rope_parameters": dict(layer.rope_parameters),
    }


def drop_target_copy(peer: PeerFolder, tensors: dict, key: str, own: torch.Tensor) -> None:
    """Remove a peer's copy of the target's embedding or head (`key`) after checking it is
    exactly the target's own: draftzoo's drafters read the target's, so another one would
    draft other tokens and is refused."""
    tensor = tensors.pop(key, None)
    if tensor is None:
        return
    own = own.detach().to("cpu", tensor.dtype)
    if tensor.shape != own.shape or not torch.equal(tensor, own):
        raise PeerImportError(
            f"{peer.path}: its {key.removesuffix('.weight')} is not the target's; draftzoo's "
            "drafters read the target's own, so this one would draft other tokens"
        )


def is_peer_folder(path: Path) -> bool:
    """A folder with weights and no draftzoo record: a candidate for import."""
    path = Path(path)
    if not path.is_dir() or (path / RECORD_FILE).exists():
        return False
    return any(path.glob(SAFETENSORS_PATTERN)) or any(
        any(path.glob(pattern)) for pattern in PICKLE_PATTERNS
    )


def named_verifier(peer: PeerFolder) -> str | None:
    """The target a peer's config names (speculators' verifier, Medusa's base model)."""
    config = peer.config
    verifier = (config.get("speculators_config") or {}).get("verifier") or {}
    for name in (verifier.get("name_or_path"), config.get("base_model_name_or_path")):
        if isinstance(name, str) and name:
            return name
    return None


def same_model(named: str, target: str) -> bool:
    """Whether a peer's verifier name and the target are the same model: the same string or
    folder, or the same hub id at the end of a local path."""
    if named == target:
        return True
    a, b = Path(_located(named)).expanduser(), Path(_located(target)).expanduser()
    if a.exists() and b.exists():
        return a.resolve() == b.resolve()
    return a.parts[-2:] == b.parts[-2:] or (len(a.parts) == 1 and a.name == b.name)


def _located(name: str) -> str:
    """A target name's folder where draftzoo knows it (`testbed-small`), else the name."""
    from .defaults import target_location
    from .target import TargetError

    try:
        return target_location(name)
    except TargetError:  # a path on another machine, a target not fetched here
        return name


@contextmanager
def untrusted(path: Path) -> Iterator[None]:
    """Whatever a peer folder's files make the conversion raise (they are untrusted input: a
    `hidden_size` that is a string, zero heads, a verifier that is a number) is one line
    naming the folder."""
    try:
        yield
    except DraftzooError:
        raise
    except Exception as err:
        said = " ".join(str(err).split())[:300]
        raise PeerImportError(f"{path} does not import: {type(err).__name__}: {said}") from err


def recognise(peer: PeerFolder, target) -> Imported:
    """The one layout that claims `peer` (every registered family's importers asked)."""
    from .families import family_specs, resolve

    claimed = []
    for spec in family_specs().values():
        for layout, reference in spec.importers.items():
            imported = resolve(reference)(peer, target)
            if imported is not None:
                claimed.append((layout, imported))
    if not claimed:
        known = [
            f"{s.display_name} ({', '.join(s.importers)})"
            for s in family_specs().values()
            if s.importers
        ]
        kind = peer.config.get("speculators_model_type")
        said = f"speculators_model_type {kind!r}, " if kind else ""
        raise PeerImportError(
            f"{peer.path} is in no layout draftzoo imports ({said}config architectures "
            f"{peer.architectures() or 'none'}, {len(peer.tensors)} tensors); it reads: "
            + "; ".join(known)
        )
    if len(claimed) > 1:
        raise PeerImportError(
            f"{peer.path} matches several layouts ({', '.join(c[0] for c in claimed)})"
        )
    return claimed[0][1]


def source_digest(peer: PeerFolder) -> str:
    """sha256 over the peer's config.json and weight files (name + content)."""
    digest = hashlib.sha256()
    for name in ("config.json", *peer.files):
        file = peer.path / name
        if file.is_file():
            digest.update(name.encode() + b"\0")
            with file.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def chosen_target(peer: PeerFolder, target: str | None) -> str:
    """The target named, else the verifier the peer's config names (else an error)."""
    if target:
        return str(target)
    named = named_verifier(peer)
    if not named:
        raise PeerImportError(
            f"{peer.path}: its config names no verifier; pass --target with the model it drafts for"
        )
    return named


def load_target_adapter(target: str):
    """The target by name or folder, as a `TargetAdapter`."""
    from .defaults import target_location
    from .target import TargetAdapter

    return TargetAdapter.from_pretrained(target_location(target))


def write_imported(tmp: Path, peer: PeerFolder, imported: Imported, adapter, target: str) -> None:
    """The converted drafter's files in `tmp`: config, tensors, copied files, the record."""
    # each tensor its own storage: peers may store one tensor under several names (Medusa's
    # reference repeats one block object), which safetensors writes only unshared
    tensors = {k: v.detach().clone().contiguous() for k, v in imported.tensors.items()}
    write_drafter_files(tmp, imported.config, tensors)
    for name in imported.copy_files:
        shutil.copy2(peer.path / name, tmp / name)
    record = {
        "version": RECORD_VERSION,
        "family": imported.family,
        "target": adapter.fingerprint().to_dict(),
        "hidden_state_layers": list(imported.layers),
        "layer_convention": "hf_hidden_states (index k = input to decoder layer k; N = final norm)",
        "recipe": {"target": {"path": target}},
        "data_hash": None,
        "training": {},
        "imported": {
            "layout": imported.layout,
            "source": str(Path(peer.path).resolve()),
            "files": list(peer.files),
            "sha256": source_digest(peer),
            "verifier": imported.verifier,
            "notes": list(imported.notes),
        },
    }
    (tmp / RECORD_FILE).write_text(json.dumps(record, indent=1))
