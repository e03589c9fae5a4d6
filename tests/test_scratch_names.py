"""Every temporary file draftzoo writes has a fresh name (`output_folders.fresh_path`): a link
planted at any name a writer used to choose (`report.json.tmp`, `.LEADERBOARD.md.tmp`,
`index.json.tmp`, `<file>.partial`, ...) is never written through, and what is written gets the
permissions the umask gives. The rule is checked on the source: no module but
`output_folders.py` builds a scratch name from a fixed suffix."""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from pathlib import Path

import pytest

from draftzoo.architectures.output_folders import fresh_file, fresh_path, write_text_atomically
from draftzoo.architectures.packaged_files import extract_member
from draftzoo.cli import main
from draftzoo.data.capture import _write_json_atomic
from tests.test_cli_errors import _assert_one_error_line

ROOT = Path(__file__).parents[1]
PACKAGES = ("architectures", "data", "train", "inference", "eval", "draftzoo")
#: a string that ends a name with a scratch suffix (`name + ".tmp"`, `f".{name}.tmp"`, ...) or
#: starts one with a scratch prefix (`f".tmp-step-{step}"`, `".old-"`)
FIXED_SCRATCH = re.compile(r"""\.(tmp|partial|part)(\.\w+)?["']|["']\.?(tmp|old|partial)-""")


#: a file opened to append by `open`, which follows a link at the name
APPEND = re.compile(r"""open\([^)]*["']a[bt+]?["']""")


def _lines_matching(pattern: re.Pattern) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "output_folders.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_no_module_builds_a_fixed_scratch_name():
    assert _lines_matching(FIXED_SCRATCH) == []


def test_no_module_appends_but_through_the_no_follow_opener():
    """`output_folders.appending` opens with O_NOFOLLOW; `open(path, "a")` would append to
    whatever a link at the name points to (the training rows log did)."""
    assert _lines_matching(APPEND) == []


def _plant(folder: Path, names: list[str]) -> Path:
    """A secret outside `folder` and a link to it at each of `names` inside it."""
    secret = folder.parent / f"{folder.name}-secret.txt"
    secret.write_text("keep me")
    folder.mkdir(exist_ok=True)
    for name in names:
        os.symlink(secret, folder / name)
    return secret


def test_links_at_the_old_scratch_names_are_never_written_through(tmp_path):
    out = tmp_path / "out"
    secret = _plant(out, ["notes.txt.tmp", "index.json.tmp", "x.partial", ".x.partial"])
    _write_json_atomic(out / "index.json", {"shards": []})
    write_text_atomically(out / "notes.txt", "new")
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/x", "payload")
    digest = hashlib.sha256(b"payload").hexdigest()
    extract_member(wheel, "pkg/x", out / "x", digest)
    assert secret.read_text() == "keep me"
    assert json.loads((out / "index.json").read_text()) == {"shards": []}
    assert (out / "x").read_text() == "payload" and (out / "notes.txt").read_text() == "new"
    left = sorted(p.name for p in out.iterdir())
    # the links stay links, untouched, and no temporary is left
    assert left == [
        ".x.partial",
        "index.json",
        "index.json.tmp",
        "notes.txt",
        "notes.txt.tmp",
        "x",
        "x.partial",
    ]
    assert all((out / n).is_symlink() for n in left if n.endswith((".tmp", ".partial")))


def test_a_link_at_the_final_name_is_replaced_not_followed(tmp_path):
    secret = _plant(tmp_path / "out", ["report.json"])
    write_text_atomically(tmp_path / "out" / "report.json", "{}")
    assert secret.read_text() == "keep me"
    assert not (tmp_path / "out" / "report.json").is_symlink()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError), fresh_file(path) as handle:
        handle.write("half")
        raise RuntimeError("killed")
    with pytest.raises(RuntimeError), fresh_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_what_is_written_gets_the_umask_permissions(tmp_path):
    previous = os.umask(0o022)
    try:
        write_text_atomically(tmp_path / "a.txt", "x")
        with fresh_path(tmp_path / "b.bin") as tmp:
            tmp.write_bytes(b"x")
        os.umask(0o077)
        write_text_atomically(tmp_path / "c.txt", "x")
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == {"a.txt": 0o644, "b.bin": 0o644, "c.txt": 0o600}


def test_user_turns_refuses_an_output_that_is_a_link(testbed_tiny, tmp_path, capsys):
    """A dangling link at the output would create the file wherever it points."""
    outside = tmp_path / "elsewhere" / "turns.jsonl"
    (tmp_path / "here").mkdir()
    os.symlink(outside, tmp_path / "here" / "turns.jsonl")
    argv = ["user-turns", "--target", str(testbed_tiny[0]), "--count", "2"]
    argv += ["--output", str(tmp_path / "here" / "turns.jsonl")]
    _assert_one_error_line(argv, capsys, "not a regular file")
    assert not outside.exists() and not outside.parent.exists()


def test_exports_and_zoo_entries_are_readable_as_the_umask_says(tiny_drafters, tmp_path):
    """Under umask 022 an engine or a colleague running as another user can read them: every
    folder written whole (drafters, exports, imports, zoo entries) is moved in by
    `output_folders.swapped_in`, which gives it the umask's permissions; an export here."""
    previous = os.umask(0o022)
    try:
        out = tmp_path / "export"
        argv = ["export", str(tiny_drafters["eagle3"]), "--format", "vllm"]
        assert main([*argv, "--output-dir", str(out), "--no-target-check"]) == 0
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert out.stat().st_mode & 0o777 == 0o755
    assert modes and set(modes.values()) == {0o644}, modes


@pytest.mark.parametrize("fmt", ["vllm", "speculators", "sglang"])
@pytest.mark.parametrize("family", ["eagle3", "eagle1", "draft_lm"])
def test_a_refused_export_leaves_nothing_behind(tiny_drafters, tmp_path, capsys, fmt, family):
    """Whatever the format asks of a target that is not there, the export is written whole or
    refused in one line, and leaves no scratch folder."""
    out = tmp_path / "export"
    argv = ["export", str(tiny_drafters[family]), "--format", fmt, "--output-dir", str(out)]
    code = main([*argv, "--no-target-check", "--target", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code in (0, 2) and "Traceback" not in err, err
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == (["export"] if code == 0 else []), left


def test_an_export_refuses_a_linked_tokenizer_file(tiny_drafters, tmp_path, capsys):
    """A link in the drafter would be copied as the file it points to, out of the drafter."""
    import shutil

    drafter = tmp_path / "drafter"
    shutil.copytree(tiny_drafters["eagle3"], drafter)
    secret = tmp_path / "secret.jinja"
    secret.write_text("{{ secret }}")
    (drafter / "chat_template.jinja").unlink(missing_ok=True)
    os.symlink(secret, drafter / "chat_template.jinja")
    out = tmp_path / "export"
    argv = ["export", str(drafter), "--format", "vllm", "--output-dir", str(out)]
    _assert_one_error_line([*argv, "--no-target-check"], capsys, "symbolic link")
    assert not out.exists() and not list(tmp_path.glob(".export*"))


def test_an_export_into_the_working_directory_is_refused(tiny_drafters, tmp_path, capsys):
    """An empty working directory would be replaced whole, leaving the user's shell in a
    folder that no longer exists."""
    here = tmp_path / "here"
    here.mkdir()
    previous = Path.cwd()
    os.chdir(here)
    try:
        argv = ["export", str(tiny_drafters["eagle3"]), "--format", "vllm", "--output-dir", "."]
        _assert_one_error_line(argv, capsys, "working directory")
    finally:
        os.chdir(previous)
    assert list(here.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["here"]
