"""The testbed corpus: real Python source that ships with every machine of this kind.

The corpus is the CPython standard library of the running interpreter (its tests included) plus
the Python sources of a fixed list of installed distributions. Files are listed in a
deterministic order and split into train / held-out by module, so that held-out text is code the
target never saw.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..architectures.errors import DraftzooError

#: Distributions whose Python sources join the stdlib in the corpus (the project's dependency
#: closure). Missing ones are an error, not a silent skip: the corpus would change.
DEFAULT_PACKAGES: tuple[str, ...] = (
    "torch",
    "transformers",
    "accelerate",
    "datasets",
    "peft",
    "deepspeed",
    "wandb",
    "numpy",
    "huggingface_hub",
    "tokenizers",
    "safetensors",
)

STDLIB = "stdlib"


class CorpusError(DraftzooError, RuntimeError):
    """The corpus cannot be assembled as configured."""


@dataclass(frozen=True)
class SourceFile:
    """One Python file of the corpus."""

    path: Path
    module: str  # dotted module name, e.g. "json.decoder" or "transformers.trainer"
    origin: str  # "stdlib" or the distribution name
    split: str  # "train" or "heldout"


@dataclass(frozen=True)
class CorpusSpec:
    """What goes into the corpus and how it is split."""

    packages: tuple[str, ...] = DEFAULT_PACKAGES
    heldout_percent: float = 4.0  # share of stdlib module groups kept out of training
    max_file_bytes: int = 400_000  # larger files (generated tables, vendored blobs) are skipped
    max_files: int | None = None  # cap per origin, for tiny test corpora; None = all
    include_stdlib: bool = True  # read the running interpreter's standard library
    stdlib_dir: Path | None = None  # another stdlib folder instead (tests, other Pythons)

    def __post_init__(self) -> None:
        if not 0.0 <= self.heldout_percent < 50.0:
            raise ValueError(f"heldout_percent must be in [0, 50), got {self.heldout_percent}")
        if not self.include_stdlib and not self.packages:
            raise ValueError("the corpus needs the stdlib or at least one package")

    @property
    def origins(self) -> tuple[str, ...]:
        """Where the text comes from, in reading order."""
        return ((STDLIB,) if self.include_stdlib else ()) + tuple(self.packages)


def stdlib_root(spec: CorpusSpec) -> Path:
    """The standard-library folder the corpus reads."""
    root = spec.stdlib_dir or Path(sysconfig.get_paths()["stdlib"])
    if not (root / "os.py").is_file():
        raise CorpusError(f"no Python standard library at {root} (os.py missing)")
    return root


def _split_for(module: str, heldout_percent: float) -> str:
    """Held-out by module group (first two dotted parts), stable across machines."""
    group = ".".join(module.split(".")[:2])
    bucket = int(hashlib.sha256(group.encode()).hexdigest()[:8], 16) % 10_000
    return "heldout" if bucket < heldout_percent * 100 else "train"


def _module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _stdlib_files(spec: CorpusSpec) -> Iterator[SourceFile]:
    root = stdlib_root(spec)
    paths = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    if spec.max_files is not None:
        paths = paths[: spec.max_files]
    for path in paths:
        module = _module_name(path.relative_to(root))
        yield SourceFile(path, module, STDLIB, _split_for(module, spec.heldout_percent))


def package_version(name: str) -> str:
    """The installed version of a distribution, or a clear error."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError as err:
        raise CorpusError(
            f"corpus package {name!r} is not installed; install it or drop it from 'packages'"
        ) from err


def _package_files(name: str, spec: CorpusSpec) -> Iterator[SourceFile]:
    dist = importlib.metadata.distribution(name)
    located = []
    for entry in dist.files or ():
        if entry.suffix != ".py":
            continue
        path = Path(entry.locate())
        if path.is_file():
            located.append((str(entry), path))
    located.sort()
    if spec.max_files is not None:
        located = located[: spec.max_files]
    for relative, path in located:
        # Package sources always train: held-out text is stdlib code the model never saw.
        yield SourceFile(path, _module_name(Path(relative)), name, "train")


def list_sources(spec: CorpusSpec) -> list[SourceFile]:
    """All corpus files in a deterministic order."""
    files: list[SourceFile] = []
    for origin in spec.origins:
        if origin == STDLIB:
            files.extend(_stdlib_files(spec))
        else:
            package_version(origin)
            files.extend(_package_files(origin, spec))
    if not files:
        raise CorpusError(f"the corpus is empty for origins {list(spec.origins)}")
    return files


def read_source(source: SourceFile, max_bytes: int) -> str | None:
    """The file's text, or None when it is too large or not UTF-8 (recorded as skipped)."""
    raw = source.path.read_bytes()
    if len(raw) > max_bytes or b"\x00" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def corpus_versions(spec: CorpusSpec) -> dict[str, str]:
    """Versions of everything the corpus was read from, for the testbed's record."""
    import platform

    versions = {STDLIB: platform.python_version()}
    for origin in spec.origins:
        if origin != STDLIB:
            versions[origin] = package_version(origin)
    return versions


def fingerprint_files(files: Sequence[SourceFile]) -> str:
    """A short hash of the file list (paths relative to their origin, split, size)."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.origin}:{f.module}:{f.split}:{f.path.stat().st_size}\n".encode())
    return digest.hexdigest()[:16]
