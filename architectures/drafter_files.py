"""The front door of a drafter folder: its files read once, hashed as they are read.

    files = DrafterFiles.open(folder)       # the record, then every defining file, once each
    files.record, files.sha256              # the checkpoint hash of exactly these bytes
    files.json("config.json"), files.weights()

Loading, evaluation, certification and export open a drafter through here, and the family
loaders build their modules from what it read: what was hashed is what was loaded, so a folder
that changes meanwhile cannot slip a different file in, and no file is read twice.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .drafter_io import (
    RECORD_FILE,
    WEIGHTS_FILE,
    DrafterError,
    check_drafter_target,
    defining_names,
    parse_record,
)
from .output_folders import open_own_file


class DrafterFiles:
    """A drafter folder's defining files, read once (`open`)."""

    def __init__(self, folder: Path, contents: dict[str, bytes], record: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.record = record
        self._contents = contents
        digest = hashlib.sha256()
        for name, data in contents.items():  # in `defining_names` order, as `checkpoint_hash`
            digest.update(name.encode() + b"\0")
            digest.update(data)
        #: the checkpoint hash of the bytes read (`drafter_io.checkpoint_hash` of the folder)
        self.sha256 = digest.hexdigest()

    @classmethod
    def open(cls, folder: Path) -> DrafterFiles:
        """Read the record, then each file that defines the drafter, once."""
        folder = Path(folder)
        if not (folder / RECORD_FILE).is_file():
            raise DrafterError(f"{folder} is not a draftzoo drafter (no {RECORD_FILE})")
        record_bytes = _read(folder, RECORD_FILE)
        record = parse_record(record_bytes, folder / RECORD_FILE)
        contents = {}
        for name in defining_names(record):
            contents[name] = record_bytes if name == RECORD_FILE else _read(folder, name)
        return cls(folder, contents, record)

    def data(self, name: str) -> bytes:
        """A defining file's bytes as read."""
        if name not in self._contents:
            raise DrafterError(f"{self.folder / name} was released after its module was built")
        return self._contents[name]

    def release(self) -> None:
        """Drop the bytes read (the module built from them holds its own tensors); the record
        and the hash stay."""
        self._contents = {}

    def json(self, name: str = "config.json") -> dict[str, Any]:
        """A defining JSON file as an object."""
        try:
            data = json.loads(self.data(name))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DrafterError(f"{self.folder / name} is not valid JSON: {err}") from err
        if not isinstance(data, dict):
            raise DrafterError(f"{self.folder / name} is not a JSON object")
        return data

    def weights(self, name: str = WEIGHTS_FILE) -> dict:
        """The tensors of a defining safetensors file (never a pickle)."""
        from safetensors import SafetensorError
        from safetensors.torch import load

        try:
            return load(self.data(name))
        except (SafetensorError, ValueError) as err:
            raise DrafterError(f"{self.folder / name} cannot be read: {err}") from err

    def check_target(self, fingerprint) -> dict[str, Any]:
        """The record, after refusing a target the drafter was not built for."""
        return check_drafter_target(self.folder, fingerprint, self.record)


def _read(folder: Path, name: str) -> bytes:
    file = folder / name
    if not file.is_file():
        pickled = name == WEIGHTS_FILE and (folder / "pytorch_model.bin").is_file()
        raise DrafterError(
            f"{folder} is not a complete drafter: {name} is missing"
            + (
                " (draftzoo reads drafters as safetensors and JSON only; a pickle such as "
                "pytorch_model.bin could run code)"
                if pickled
                else ""
            )
        )
    try:
        with open_own_file(file, DrafterError) as handle:
            return handle.read()
    except OSError as err:
        raise DrafterError(f"{file} cannot be read: {err}") from err


def opened(folder: Path, files: DrafterFiles | None) -> DrafterFiles:
    """`files` when the caller opened the folder already, else the folder opened now."""
    return files if files is not None else DrafterFiles.open(folder)
