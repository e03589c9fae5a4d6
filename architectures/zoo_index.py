"""The zoo index: a versioned JSON file listing every published drafter and where it lives.

    <zoo>/index.json   {"version": 1, "drafters": {name: entry, ...}}
    <zoo>/<name>/      the drafter (config.json, model.safetensors, draftzoo.json), its model
                       card (README.md), eval report and plots

An entry records the name, family, target fingerprint, base model, headline metrics, the
checkpoint hash and the folder (relative to the index). The index is rewritten whole under a
lock and renamed into place, so a reader sees the old index or the new one, never half of one.

Zoos searched by name: `$DRAFTZOO_ZOO` (default `<cache>/zoo`, see `defaults`), then the zoo
that ships inside the package (the testbed drafters).
"""

from __future__ import annotations

import difflib
import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .defaults import builtin_zoo_dir, default_zoo_dir
from .errors import DraftzooError

INDEX_FILE = "index.json"
INDEX_VERSION = 1
ENTRY_FIELDS = (
    "name",
    "family",
    "target",
    "base_model",
    "metrics",
    "files",
    "checkpoint_hash",
    "published",
)


class ZooError(DraftzooError, LookupError):
    """A name the zoo does not hold, or an index that cannot be read."""


class ZooIndex:
    """One zoo folder and its `index.json`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.file = self.root / INDEX_FILE

    def entries(self) -> dict[str, dict[str, Any]]:
        """name -> entry; an absent index is an empty zoo."""
        if self.file.is_symlink():
            raise ZooError(f"{self.file} is a symbolic link; a zoo index is a regular file")
        if not self.file.is_file():
            return {}
        try:
            data = json.loads(self.file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ZooError(f"{self.file} is not valid JSON: {err}") from err
        except OSError as err:
            raise ZooError(f"{self.file} cannot be read: {err}") from err
        if not isinstance(data, dict) or data.get("version") != INDEX_VERSION:
            version = data.get("version") if isinstance(data, dict) else None
            raise ZooError(f"{self.file}: index version {version!r} is not supported")
        entries = data.get("drafters")
        if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
            raise ZooError(f"{self.file}: 'drafters' is not an object of entries")
        return entries

    def folder(self, name: str) -> Path:
        """Where entry `name`'s files are. A publish killed between moving the old folder to
        its `old` scratch folder and renaming the new one into place leaves the old entry whole
        there, and the index (written last) still describes it."""
        from .output_folders import interrupted_swap

        entries = self.entries()
        files = entries[name].get("files") if isinstance(entries[name], dict) else None
        folder = (self.root / str(files)).resolve()
        if not isinstance(files, str) or folder.parent != self.root.resolve():
            raise ZooError(
                f"{self.file}: entry {name!r} names files {files!r}, not a folder of the zoo"
            )
        return interrupted_swap(folder) or folder

    @contextmanager
    def locked(self) -> Iterator[dict[str, dict[str, Any]]]:
        """Hold the zoo's lock; yields the entries, written back (atomically) on success."""
        from .output_folders import output_path

        output_path(self.root).mkdir(parents=True, exist_ok=True)
        try:  # never through a symbolic link, and never truncating what is there
            fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            raise ZooError(f"{self.root / '.lock'} cannot be the zoo's lock: {err}") from err
        with os.fdopen(fd, "r+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = self.entries()
            self._saved = _payload(entries)
            yield entries
            if _payload(entries) != self._saved:
                self.save(entries)

    def save(self, entries: dict[str, dict[str, Any]]) -> None:
        """Write the index now (inside `locked()`), whole; a failure leaves the old one."""
        from .output_folders import write_text_atomically

        text = _payload(entries)
        write_text_atomically(self.file, text)
        self._saved = text


def _payload(entries: dict[str, dict[str, Any]]) -> str:
    return (
        json.dumps({"version": INDEX_VERSION, "drafters": dict(sorted(entries.items()))}, indent=1)
        + "\n"
    )


def close_names(name: str, names: list[str]) -> list[str]:
    """Names that look like `name` (typos, a missing suffix)."""
    near = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    near += [n for n in names if (name in n or n in name) and n not in near]
    return near[:5]


def find_in_zoos(name: str, zoos: list[Path] | None = None) -> tuple[Path, dict[str, Any]]:
    """(folder, entry) of the first zoo that holds `name`; a clear error listing close names."""
    zoos = zoos if zoos is not None else [default_zoo_dir(), builtin_zoo_dir()]
    known: list[str] = []
    for root in zoos:
        index = ZooIndex(root)
        entries = index.entries()
        if name in entries:
            return index.folder(name), entries[name]
        known += list(entries)
    near = close_names(name, known)
    hint = f"; did you mean: {', '.join(near)}?" if near else ""
    searched = ", ".join(str(z) for z in zoos)
    raise ZooError(f"no drafter named {name!r} in the zoo ({searched}){hint}")


def resolve_drafter(name_or_path: str | Path, zoos: list[Path] | None = None):
    """(folder, zoo entry or None): a drafter folder as given, else a name in the zoo."""
    path = Path(name_or_path)
    if path.is_dir():
        return path, None
    return find_in_zoos(str(name_or_path), zoos)


def entry_line(name: str, entry: dict[str, Any]) -> str:
    """One zoo entry as `draftzoo zoo list` shows it: family, target, numbers, certificate."""
    metrics = "; ".join(
        f"{key} tau {m['tau']:.2f} speedup {m['speedup']:.2f}x"
        for key, m in entry["metrics"].items()
    )
    certified = "certified" if (entry.get("certificate") or {}).get("passed") else "-"
    return f"  {name:28} {entry['family']:9} {entry['base_model']:20} {metrics}; {certified}"
