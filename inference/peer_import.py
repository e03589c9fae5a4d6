"""Importing a peer's drafter folder: convert it (architectures/peer_import.py), check that its
family's runtime loads it for the target, and move it into place; or convert it on load, once,
into the import cache (`$DRAFTZOO_CACHE/imported/<digest>`).

    draftzoo import PEER_FOLDER --output-dir runs/imported [--target TARGET]
    draftzoo.load(PEER_FOLDER, target=...)    # also eval, certify, publish: converted on load
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from ..architectures.defaults import cache_root
from ..architectures.drafter_files import DrafterFiles
from ..architectures.drafter_io import (
    RECORD_FILE,
    DrafterError,
    check_replaceable,
    output_path,
    replace_dir,
    scratch_dir,
)
from ..architectures.errors import DraftzooError
from ..architectures.families import family_spec
from ..architectures.peer_import import (
    PeerImportError,
    chosen_target,
    is_peer_folder,
    load_target_adapter,
    read_peer_folder,
    recognise,
    same_model,
    source_digest,
    untrusted,
    write_imported,
)
from .drafter_request import DrafterRequest
from .proposal_settings import ProposalSettings

#: where drafters converted on load are kept ($DRAFTZOO_CACHE/imported/<digest>)
CACHE_SUBDIR = "imported"


def import_drafter(source: Path, output_dir: Path, target: str | None = None) -> Path:
    """Convert the peer drafter in `source` into a draftzoo drafter folder `output_dir` for
    `target` (default: the verifier its config names); returns the folder."""
    output_dir = output_path(output_dir)
    check_replaceable(output_dir, inputs=(Path(source),))
    peer = read_peer_folder(source)
    with untrusted(peer.path):
        target = chosen_target(peer, target)
    adapter = load_target_adapter(target)
    with untrusted(peer.path):
        imported = recognise(peer, adapter)
    if imported.verifier and not same_model(imported.verifier, target):
        raise PeerImportError(
            f"{peer.path}: its config names verifier {imported.verifier!r}, not the target "
            f"{target!r}; pass --target with the model it was trained for"
        )
    tmp = scratch_dir(output_dir, "tmp")
    try:
        with untrusted(peer.path):
            write_imported(tmp, peer, imported, adapter, target)
        _check_loads(tmp, adapter)
        return replace_dir(tmp, output_dir, inputs=(Path(source),))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_loads(folder: Path, adapter) -> None:
    """The family's own loader on the converted folder (fingerprint, names, shapes)."""
    files = DrafterFiles.open(folder)
    record = files.record
    spec = family_spec(record["family"])
    source, layout = record["imported"]["source"], record["imported"]["layout"]
    request = DrafterRequest(ProposalSettings(num_speculative_tokens=None), files=files)
    try:
        spec.runtime_loader()(folder, record, adapter.model, adapter.tokenizer, request)
    except Exception as err:  # the converted tensors are the peer's untrusted input
        # said of the source folder: the scratch folder the conversion is in means nothing
        said = " ".join(str(err).replace(f"{folder}: ", "").replace(str(folder), "it").split())
        kind = "" if isinstance(err, DraftzooError) else f"{type(err).__name__}: "
        raise PeerImportError(
            f"{source} does not load as a {spec.display_name} drafter ({layout}): "
            f"{kind}{said[:300]}"
        ) from err


def imported_folder(source: Path, target: str | None = None) -> Path:
    """The draftzoo folder converted from peer folder `source` for `target`, made once and kept
    in the import cache (a changed source converts again)."""
    peer = read_peer_folder(source)
    with untrusted(peer.path):
        target = chosen_target(peer, target)
    key = hashlib.sha256(f"{source_digest(peer)}\0{target}".encode()).hexdigest()[:24]
    folder = cache_root() / CACHE_SUBDIR / key
    if (folder / RECORD_FILE).is_file():
        return folder
    os.makedirs(folder.parent, exist_ok=True)
    return import_drafter(source, folder, target)


def drafter_from_peer(path: Path, target: str | None) -> Path:
    """`path` itself when it is a draftzoo drafter, else its conversion (a peer folder)."""
    if is_peer_folder(path):
        return imported_folder(path, target)
    if not (Path(path) / RECORD_FILE).is_file():
        raise DrafterError(f"{path} is not a draftzoo drafter (no {RECORD_FILE})")
    return Path(path)
