"""What a command does to the file system, seen from inside the process: a Python audit hook
(`sys.addaudithook`) records every path opened to write or to read, created, renamed, removed
or re-permissioned while a trace is active, with where it led at that moment (its real path:
a link planted at the name shows there, unless the call acts on the link itself, as a rename
or an `open` with O_NOFOLLOW does). Events fire before the call, so a call refused by the
kernel is recorded too. Names that `tempfile` chose are kept apart: they are
drawn afresh on every run, so nobody can plant anything at them.

Writes made outside Python (safetensors' and torch's own file writers) do not raise audit
events; the harness that uses this also compares the folders around a command before and
after it."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

#: flags of `open` / `os.open` that change or create a file
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


@dataclass(frozen=True)
class Touch:
    """One path a command used: the name it gave and where that name led then."""

    event: str
    name: str
    real: str


@dataclass
class Trace:
    """Every path one command touched, in order."""

    written: list[Touch] = field(default_factory=list)
    removed: list[Touch] = field(default_factory=list)
    read: list[Touch] = field(default_factory=list)
    #: names `tempfile.mkstemp` / `mkdtemp` drew
    drawn: set[str] = field(default_factory=set)

    def touched(self) -> list[Touch]:
        return [*self.written, *self.removed]


_active: list[Trace] = []
_busy: list[bool] = []  # the hook's own calls (realpath) are not recorded


#: events that act on a link at the name itself, never on what it points to
NOT_FOLLOWED = {
    "os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.symlink", "os.link",
    "shutil.rmtree", "shutil.copytree",
}  # fmt: skip


def _touch(event: str, path, follows: bool = True) -> Touch | None:
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)):
        return None  # a file descriptor
    name = os.path.abspath(os.fspath(path))
    if follows and event not in NOT_FOLLOWED:
        return Touch(event, name, os.path.realpath(name))
    head, tail = os.path.split(name)
    return Touch(event, name, os.path.join(os.path.realpath(head), tail))


def _follows(flags) -> bool:
    """Whether `open` with these flags goes through a link at the name (O_NOFOLLOW and
    O_CREAT | O_EXCL refuse one)."""
    if not isinstance(flags, int):
        return True
    exclusive = flags & os.O_CREAT and flags & os.O_EXCL
    return not (flags & os.O_NOFOLLOW or exclusive)


def _is_write(mode, flags) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & WRITE_FLAGS)


def _record(trace: Trace, event: str, args: tuple) -> None:
    if event == "open":
        touch = _touch(event, args[0], _follows(args[2]))
        if touch is not None:
            (trace.written if _is_write(args[1], args[2]) else trace.read).append(touch)
        return
    if event in ("tempfile.mkstemp", "tempfile.mkdtemp"):
        trace.drawn.add(os.path.abspath(args[0]))
        return
    relative = event.startswith("os.") and event != "os.truncate" and args[-1] not in (-1, None)
    if relative:
        return  # dir_fd-relative: inside a tree already recorded (shutil.rmtree's walk)
    if event in ("os.remove", "os.rmdir", "shutil.rmtree"):
        targets, into = [args[0]], trace.removed
    elif event == "os.rename":
        trace.removed.extend(t for t in [_touch(event, args[0])] if t is not None)
        targets, into = [args[1]], trace.written
    elif event in ("os.mkdir", "os.chmod", "os.chown", "os.utime", "os.truncate"):
        targets, into = [args[0]], trace.written
    elif event in ("os.symlink", "os.link", "shutil.copyfile", "shutil.copytree", "shutil.move"):
        targets, into = [args[1]], trace.written
    else:
        return
    into.extend(t for t in map(lambda p: _touch(event, p), targets) if t is not None)


def _hook(event: str, args: tuple) -> None:
    if _active and not _busy and event.startswith(("open", "os.", "shutil.", "tempfile.")):
        _busy.append(True)
        try:
            _record(_active[-1], event, args)
        finally:
            _busy.pop()


sys.addaudithook(_hook)  # audit hooks cannot be removed: this one records only inside `traced`


@contextlib.contextmanager
def traced() -> Iterator[Trace]:
    """Record what the code inside the block touches."""
    trace = Trace()
    _active.append(trace)
    try:
        yield trace
    finally:
        _active.remove(trace)
