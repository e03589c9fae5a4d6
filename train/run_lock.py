"""One training run at a time in a working folder.

The main process holds an advisory lock (`flock`) on `<work_dir>/run.lock` for the whole run;
a second `draftzoo train` of the same recipe (or any recipe with that working folder) is refused
with one line naming the holder's pid, before it touches a checkpoint. The kernel releases the
lock when its holder exits, killed or not, so a lock is never stale. Other ranks of a
distributed run work under their main process's lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..architectures.errors import DraftzooError

LOCK_FILE = "run.lock"


class RunLockError(DraftzooError, RuntimeError):
    """Another run holds the working folder."""


class RunLock:
    """A held lock; `release()` lets the next run in (idempotent)."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def hold_work_dir(work_dir: Path) -> RunLock:
    """Lock `work_dir` for this run (main process only), or refuse: another run holds it."""
    if int(os.environ.get("RANK", "0")) != 0:
        return RunLock(None)
    path = Path(work_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        raise RunLockError(f"{path}: cannot open the run lock ({err.strerror})") from err
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunLockError(
            f"{work_dir} is in use by another draftzoo train (pid {holder}); wait for it to "
            "finish or give this run another output_dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return RunLock(fd)
