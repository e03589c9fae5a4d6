"""The one rule for what draftzoo writes: folders written whole (drafters, exports, zoo
entries), single files (`fresh_file`, `fresh_path`) and files appended to (`output_lock`).

draftzoo writes and deletes only inside the folder the user named and in scratch folders it
creates itself beside it; it replaces an existing output folder only when the folder's content
says draftzoo wrote it (a drafter's `draftzoo.json`, an export's marked `config.json`, or
nothing at all), never when it is a symbolic link, an input of the same command (the drafter
being exported, the heads a run starts from, the target, or a folder holding one), a folder
a zoo index lists, or the working directory (or one holding it); what it moves in gets the
permissions the umask gives. Every single file goes through a fresh temporary name.

Scratch folders have fresh names (`.<name>.tmp-XXXXXXXX`, `.<name>.old-XXXXXXXX`, made by
`tempfile.mkdtemp`), so no folder of the user's is ever taken for one: a user's `OUT.tmp` or
`OUT.old` beside an output is never touched. A `tmp` folder a killed process left is deleted by
the next write beside it only when its mark names a process that no longer exists. A
replacement moves the old folder to an `old` scratch folder, renames the new one in and deletes
the old; a kill between the two renames leaves the old folder whole under its scratch name,
where `interrupted_swap` finds it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from .errors import DraftzooError

#: a drafter folder's record, and the zoo's index (their content marks what draftzoo wrote)
RECORD_FILE = "draftzoo.json"
INDEX_FILE = "index.json"


class OutputDirError(DraftzooError, ValueError):
    """An output folder draftzoo may not replace."""


def output_path(output: Path | str) -> Path:
    """The file or folder a command writes, as given; `.`, `..` and the like resolved to their
    name. A link at that name is refused: draftzoo never writes through one (what the user
    named would be replaced, or a place they did not name written)."""
    output = Path(output)
    output = output.resolve() if output.name in ("", ".", "..") else output
    if output.is_symlink():
        raise OutputDirError(
            f"{output} is a symbolic link (to {os.readlink(output)}); draftzoo never writes "
            "through one: name the file or folder itself"
        )
    return output


#: the file inside a `tmp` scratch folder that says which process is building it
SCRATCH_MARK = ".draftzoo-scratch"


def scratch_dir(beside: Path, kind: str) -> Path:
    """A new folder next to `beside` (same filesystem, so renames are atomic) with a name no
    other folder has: `.<name>.<kind>-XXXXXXXX`. A `tmp` folder holds `SCRATCH_MARK` (this
    process's id) until `replace_dir` moves it into place; an `old` one is left empty, for the
    old output to be renamed onto."""
    beside = Path(beside)
    beside.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_scratch(beside)
    path = Path(tempfile.mkdtemp(prefix=f".{beside.name}.{kind}-", dir=beside.parent))
    if kind == "tmp":
        (path / SCRATCH_MARK).write_text(json.dumps({"pid": os.getpid()}))
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by another user
    return True


def clean_stale_scratch(beside: Path) -> None:
    """Delete the scratch folders of `beside` that killed processes left: those whose mark
    names a process that is gone (a folder without the mark is not ours to delete); an `old`
    one only while `beside` exists (else it is the only copy, for `interrupted_swap`)."""
    stale = list(Path(beside).parent.glob(f".{Path(beside).name}.tmp-*"))
    if Path(beside).exists():
        stale += Path(beside).parent.glob(f".{Path(beside).name}.old-*")
    for path in stale:
        mark = path / SCRATCH_MARK
        if path.is_symlink() or not mark.is_file() or mark.is_symlink():
            continue
        try:
            pid = int(json.loads(mark.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)


def _holds(output: Path, source: Path) -> bool:
    """Whether replacing `output` whole would replace `source`: it is, or holds, it."""
    output, source = output.resolve(), source.resolve()
    return output == source or output in source.parents


def zoo_entry_at(folder: Path) -> str | None:
    """The name of the zoo entry whose files are `folder` (its parent's index lists it)."""
    folder = Path(folder).resolve()
    try:
        entries = json.loads((folder.parent / INDEX_FILE).read_text())["drafters"]
        for name, entry in entries.items():
            if (folder.parent / str(entry["files"])).resolve() == folder:
                return str(name)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return None


def is_marked_export(folder: Path) -> bool:
    """Whether `folder` holds an export draftzoo wrote: a `config.json` with a `draftzoo`
    entry (every exporter writes one)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "draftzoo" in config


@contextmanager
def output_lock(
    output: Path, command: str, error: type[DraftzooError] = OutputDirError
) -> Iterator[None]:
    """Hold `.<name>.lock` beside the file `output` while `command` appends to it: a second
    command on the same output is refused in one line (`error`) instead of writing its rows
    among the first's, as is an output that is a link or not a file. The lock file is opened
    with O_NOFOLLOW and never truncated; the kernel drops the lock when its holder exits. A
    lock file this call created is deleted when it ends (refused or not), while still held: a
    command that waited on it finds the path gone or another file there and takes its own."""
    output = Path(output)
    if output.is_symlink() or (output.exists() and not output.is_file()):
        raise error(f"{output} is not a regular file; draftzoo {command} writes only files it made")
    lock = output.with_name(f".{output.name}.lock")
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, created = _locked(lock, output, command, error)
    try:
        yield
    finally:
        try:
            if created:
                lock.unlink(missing_ok=True)
        finally:
            os.close(fd)


def _locked(lock: Path, output: Path, command: str, error: type[DraftzooError]) -> tuple[int, bool]:
    """(descriptor, whether this call created it) of `lock`, held exclusively; refused while
    another process holds it. Retried when the file locked is no longer the one at the path
    (its holder deleted it on the way out)."""
    while True:
        try:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                created = True
            except FileExistsError:
                fd, created = os.open(lock, os.O_RDWR | os.O_NOFOLLOW), False
        except FileNotFoundError:
            continue  # deleted between the two opens: create it
        except OSError as err:
            raise error(f"{lock} cannot be the lock of {output} ({err.strerror})") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise error(
                f"{output} is being written by another draftzoo {command}; let it finish (a "
                "rerun then resumes) or name another output"
            ) from None
        try:
            current = os.stat(lock, follow_symlinks=False).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            return fd, created
        os.close(fd)  # its holder deleted it as we took it: take the file at the path now


def refuse_working_directory(output_dir: Path) -> None:
    """Refuse an output folder that is, or holds, the working directory: replacing it would
    move the folder the user (and this process) stands in."""
    here, output = Path.cwd().resolve(), Path(output_dir).resolve()
    if output == here or output in here.parents:
        raise OutputDirError(
            f"{output_dir} is or holds the working directory, and the output folder is replaced "
            "whole; name another folder"
        )


def refuse_inputs_inside(output_dir: Path, inputs: Iterable[Path | str]) -> None:
    """Refuse an output folder that is, or holds, a file or folder the command reads: it is
    replaced whole, and its inputs would go with it."""
    for source in inputs:
        if source and Path(source).exists() and _holds(Path(output_dir), Path(source)):
            raise OutputDirError(
                f"{output_dir} is or holds {source}, which this command reads; name another "
                "output folder"
            )


def refuse_writing_into_inputs(output: Path, inputs: Iterable[Path | str]) -> None:
    """Refuse an output that is, or lies inside, a folder the command reads: writing there
    would change its own input (an eval report among a drafter's files, a zoo inside the
    drafter it publishes)."""
    for source in inputs:
        if source and Path(source).is_dir() and _holds(Path(source), Path(output)):
            raise OutputDirError(
                f"{output} is or lies inside {source}, which this command reads; name an "
                "output outside it"
            )


def check_replaceable(
    output_dir: Path, inputs: Iterable[Path | str] = (), zoo_managed: bool = False
) -> None:
    """Refuse an output folder draftzoo may not replace whole (see the module's rule).
    `inputs`: the folders and files the command reads; `zoo_managed`: the caller is `publish`,
    which replaces its own entries under the zoo's lock."""
    output_dir = Path(output_dir)
    refuse_inputs_inside(output_dir, inputs)
    if output_dir.is_symlink():
        raise OutputDirError(f"{output_dir} is a symbolic link; name a real folder to write into")
    if not output_dir.exists():
        return
    if not output_dir.is_dir():
        raise OutputDirError(f"{output_dir} is a file; name a folder to write into")
    entry = None if zoo_managed else zoo_entry_at(output_dir)
    if entry is not None:
        raise OutputDirError(
            f"{output_dir} is the zoo entry {entry!r}; `draftzoo publish --overwrite` replaces "
            "zoo entries (name another output folder)"
        )
    ours = (output_dir / RECORD_FILE).is_file() or is_marked_export(output_dir)
    if any(output_dir.iterdir()) and not ours:
        raise OutputDirError(
            f"{output_dir} already holds files draftzoo did not write, and the output folder is "
            "replaced whole; name a new folder"
        )
    refuse_working_directory(output_dir)


def replace_dir(
    tmp: Path, output_dir: Path, inputs: Iterable[Path | str] = (), zoo_managed: bool = False
) -> Path:
    """Move the finished folder `tmp` to `output_dir`, replacing any old one whole (only one
    that `check_replaceable` allows)."""
    with swapped_in(tmp, output_dir, inputs, zoo_managed):
        pass
    return output_dir


@contextmanager
def swapped_in(
    tmp: Path, output_dir: Path, inputs: Iterable[Path | str] = (), zoo_managed: bool = False
) -> Iterator[Path]:
    """`replace_dir` whose old folder is kept, under an `old` scratch name, until the `with`
    block ends: a block that fails (an index that cannot be written) puts the old folder back
    and the new one back at `tmp`, so what names the folder and the folder always agree."""
    check_replaceable(output_dir, inputs, zoo_managed)
    tmp, output_dir = Path(tmp), Path(output_dir)
    (tmp / SCRATCH_MARK).unlink(missing_ok=True)
    usual_permissions(tmp)
    old = None
    if output_dir.exists():
        old = scratch_dir(output_dir, "old")
        try:
            os.replace(output_dir, old)  # onto the empty scratch folder
        except BaseException:
            old.rmdir()
            raise
        _mark(old)  # a kill from here on leaves it to `clean_stale_scratch` or recovery
    try:
        os.replace(tmp, output_dir)
    except BaseException:
        if old is not None:
            _put_back(old, output_dir)
        raise
    try:
        yield output_dir
    except BaseException:
        os.replace(output_dir, tmp)
        if old is not None:
            _put_back(old, output_dir)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _mark(scratch: Path) -> None:
    (scratch / SCRATCH_MARK).write_text(json.dumps({"pid": os.getpid()}))


def _put_back(old: Path, output_dir: Path) -> None:
    """An `old` scratch folder back at `output_dir`, without its mark."""
    (old / SCRATCH_MARK).unlink(missing_ok=True)
    os.replace(old, output_dir)


def restore_interrupted(interrupted: Path, folder: Path) -> None:
    """Put back the old folder `interrupted_swap` found for `folder`."""
    _put_back(interrupted, folder)


def write_text_atomically(path: Path, text: str) -> None:
    """Replace the file `path` with `text` whole (`fresh_file`)."""
    with fresh_file(path) as file:
        file.write(text)


@contextmanager
def fresh_file(path: Path, mode: str = "w") -> Iterator[IO]:
    """Write the file `path` whole: into a new file of a fresh name beside it (created by
    `mkstemp`, so never opened through a link a name could hold), fsynced and renamed over
    `path` when the block ends (a link at `path` is replaced, not followed); an exception
    leaves the old file and no temporary. The file gets the permissions the umask gives."""
    with fresh_path(path) as tmp, open(tmp, mode) as file:
        yield file
        file.flush()
        os.fsync(file.fileno())


@contextmanager
def fresh_path(path: Path) -> Iterator[Path]:
    """A fresh file name beside `path` for writers that take a name (safetensors, numpy,
    matplotlib): the file is created empty by this process before the writer opens it, and
    renamed over `path` when the block ends; an exception removes it. Every temporary file
    draftzoo writes is named here: `.<name>.XXXXXXXX.tmp`."""
    path = Path(path)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    tmp = Path(name)
    try:
        yield tmp
        _give_umask_mode(tmp)  # after the writer: safetensors writes its file anew, 0600
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def appending(path: Path) -> IO:
    """The file `path` opened to append text (created if missing, with the umask's
    permissions), never through a link at its name (O_NOFOLLOW): the one way draftzoo appends."""
    try:
        handle = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as err:
        raise OutputDirError(f"{path}: cannot append to it ({err.strerror})") from err
    return os.fdopen(handle, "a", encoding="utf-8")


def open_own_file(path: Path, error: type[DraftzooError] = OutputDirError) -> IO[bytes]:
    """The file `path` opened to read, never through a link at its name (O_NOFOLLOW):
    draftzoo reads the files of its own folders (drafters, zoo entries) as they are, not what a
    link there points to. A link is refused with `error`."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise error(
                f"{path} is a symbolic link; draftzoo reads a folder's own regular files only"
            ) from err
        raise
    return os.fdopen(handle, "rb")


def _give_umask_mode(file: Path) -> None:
    """The file `file` (never a link put at its name) with the permissions the umask gives."""
    handle = os.open(file, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fchmod(handle, 0o666 & ~_umask())
    finally:
        os.close(handle)


def fresh_names_left(folder: Path, pattern: str) -> list[Path]:
    """The temporaries `fresh_path` / `fresh_dir` made in `folder` for names matching the glob
    `pattern` and a killed writer left."""
    return sorted(Path(folder).glob(f".{pattern}.*.tmp"))


def fresh_dir(path: Path) -> Path:
    """A new empty folder of a fresh name beside `path` (`.<name>.XXXXXXXX.tmp`), with the
    permissions the umask gives, for a folder written whole and then renamed to `path`."""
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    return tmp


def usual_permissions(folder: Path) -> None:
    """`folder` and everything in it as the umask makes new ones: writers that create files
    privately (`mkdtemp`, `mkstemp`, safetensors) would leave an output other users cannot
    read. Links are left alone (never followed)."""
    umask = _umask()
    for root, dirs, files in os.walk(folder):
        os.chmod(root, 0o777 & ~umask)
        for name in files:
            path = Path(root, name)
            if not path.is_symlink():
                os.chmod(path, 0o666 & ~umask)
        dirs[:] = [d for d in dirs if not Path(root, d).is_symlink()]


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def interrupted_swap(folder: Path) -> Path | None:
    """The old folder a replacement of `folder` killed between its two renames left in an
    `old` scratch folder (a drafter with its record), when `folder` itself is missing."""
    folder = Path(folder)
    if folder.exists() or not folder.parent.is_dir():
        return None
    left = [
        path
        for path in folder.parent.glob(f".{folder.name}.old-*")
        if path.is_dir() and not path.is_symlink() and (path / RECORD_FILE).is_file()
    ]
    return max(left, key=lambda path: path.stat().st_mtime) if left else None
