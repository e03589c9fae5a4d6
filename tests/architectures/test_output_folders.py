"""The folder rule (architectures/output_folders.py): a user's `OUT.tmp` / `OUT.old` beside an
output is never touched, an output never replaces an input of its own command or a zoo entry,
and a symbolic link is never written through."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from draftzoo.architectures.drafter_io import OutputDirError, checkpoint_hash
from draftzoo.architectures.export import export_drafter


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): (
            b"->" + os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
        )
        for p in sorted(root.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def test_exports_leave_the_users_lookalike_folders_alone(tiny_drafters, tmp_path):
    source = tiny_drafters["eagle3"]
    out = tmp_path / "out"
    for name in ("out.tmp", "out.old"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "mine.txt").write_text(name)
    export_drafter(source, out, "vllm")
    export_drafter(source, out, "vllm")  # the second replaces the first
    assert (tmp_path / "out.tmp" / "mine.txt").read_text() == "out.tmp"
    assert (tmp_path / "out.old" / "mine.txt").read_text() == "out.old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out.old", "out.tmp"]


def test_an_output_never_replaces_its_own_input_a_zoo_entry_or_a_link(
    tiny_drafters, tmp_path, capsys
):
    source = tmp_path / "drafter"
    shutil.copytree(tiny_drafters["eagle3"], source)
    digest = checkpoint_hash(source)
    with pytest.raises(OutputDirError, match="which this command reads"):
        export_drafter(source, source, "vllm")
    with pytest.raises(OutputDirError, match="which this command reads"):
        export_drafter(source, tmp_path, "vllm")  # a folder holding the source
    zoo = tmp_path / "zoo"
    (zoo / "entry").mkdir(parents=True)
    shutil.copytree(source, zoo / "entry", dirs_exist_ok=True)
    (zoo / "index.json").write_text(
        '{"version": 1, "drafters": {"entry": {"name": "entry", "files": "entry"}}}'
    )
    with pytest.raises(OutputDirError, match="is the zoo entry 'entry'"):
        export_drafter(source, zoo / "entry", "vllm")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "link"
    os.symlink(elsewhere, link)
    with pytest.raises(OutputDirError, match="symbolic link"):
        export_drafter(source, link, "vllm")
    assert checkpoint_hash(source) == digest and not any(elsewhere.iterdir())
    assert checkpoint_hash(zoo / "entry") == digest
    from draftzoo.cli import main

    assert main(["export", str(source), "--format", "vllm", "--output-dir", str(source)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("draftzoo: error: ") and "reads" in err[0]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no scratch left


def test_training_refuses_to_overwrite_the_heads_it_starts_from(testbed_tiny, tmp_path):
    from draftzoo.train.medusa import run as run_medusa1
    from draftzoo.train.medusa2 import run as run_medusa2
    from tests.train.helpers import tiny_medusa2_recipe, tiny_medusa_recipe, write_chat_jsonl

    chat = write_chat_jsonl(tmp_path / "chat.jsonl", 24)
    steps = {"max_steps": 1, "warmup_steps": 0, "checkpoint_every": 10}
    heads = tiny_medusa_recipe(tmp_path / "m1", testbed_tiny[0], chat, train=steps)
    run_medusa1(heads)
    before = _snapshot(Path(heads.output_dir))
    recipe = tiny_medusa2_recipe(
        tmp_path / "m2", testbed_tiny[0], chat, train=steps, init_heads=heads.output_dir
    )
    from dataclasses import replace

    recipe = replace(recipe, output_dir=heads.output_dir)
    with pytest.raises(OutputDirError, match="which this command reads"):
        run_medusa2(recipe)
    assert _snapshot(Path(heads.output_dir)) == before


def test_an_output_lock_it_created_goes_when_it_ends_refused_or_not(tmp_path):
    """`output_lock` leaves no `.<name>.lock` it created (a refused command writes nothing); a
    lock file it found (a killed run's) stays and is taken; one held is a one-line refusal."""
    import fcntl

    from draftzoo.architectures.output_folders import output_lock

    out = tmp_path / "rows.jsonl"
    lock = tmp_path / ".rows.jsonl.lock"
    with output_lock(out, "regenerate"):
        assert lock.is_file()
    assert not lock.exists() and not out.exists()
    with pytest.raises(ValueError, match="refused inside"), output_lock(out, "regenerate"):
        raise ValueError("refused inside")
    assert sorted(tmp_path.iterdir()) == []
    lock.write_text("")  # left by a run that was killed: not this call's to delete
    with output_lock(out, "regenerate"):
        pass
    assert lock.is_file()
    held = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another run writing it
        busy = "being written by another draftzoo regenerate"
        with pytest.raises(OutputDirError, match=busy), output_lock(out, "regenerate"):
            pass
        assert lock.is_file()
    finally:
        os.close(held)
