"""Fault injection: each command that writes is killed (SIGKILL, the whole process group) at
seeded random moments and run again; what it finished survives and the end is the same.

| command | killed | must hold after each kill and at the end |
|---|---|---|
| `train` (1 process) | 3 times, one folder | weights bit-identical to a straight run |
| `train` (DDP, 2 gloo processes) | 2 times | the same |
| `capture` | 3 times | every listed shard matches its sha256; shards equal a straight capture |
| `regenerate` | 3 times | no torn line survives a rerun; finished rows kept as written |
| `publish --overwrite` | 3 times | index valid; other entries byte-identical; the entry whole |
| two `publish` at once | - | both land, the index lists both |
| `train`, `capture`, full disk | each tensor write | one error line; the end as a straight run |

Kill points are drawn (seeded): the command is killed 1-3 units of progress after it restarted
(a training step, a shard, a row; for publish, once it has begun building the entry) plus a
random 0-250 ms (0-20 ms for capture, whose shards take milliseconds), so kills land inside
writes as well as between them. SIGKILL goes to the whole process tree (DDP workers live outside
the launcher's process group). The straight run is launched like the killed ones (a subprocess,
one thread). A draw that comes after the command finished is not counted. Counts are printed at
the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftzoo.inference.proposal_settings import from_name
from tests.suite_counts import KILLS
from tests.train.helpers import recipe_yaml, tiny_recipe, write_chat_jsonl

LAUNCH = Path(__file__).parents[1] / "recipes" / "launch" / "ddp.yaml"
ENV = {"OMP_NUM_THREADS": "1"}  # every run of one comparison launched alike


def _command(args: list[str], ddp: bool = False) -> list[str]:
    if ddp:
        launch = ["-m", "accelerate.commands.launch", "--config_file", str(LAUNCH)]
        return [sys.executable, *launch, "--num_processes", "2", "-m", "draftzoo", *args]
    return [sys.executable, "-m", "draftzoo", *args]


def _start(args: list[str], ddp: bool = False) -> subprocess.Popen:
    return subprocess.Popen(
        _command(args, ddp),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **ENV},
        start_new_session=True,  # off the test's own group: no signal of ours reaches pytest
    )


def _finish(args: list[str], ddp: bool = False) -> None:
    """Run to the end; it must succeed."""
    proc = _start(args, ddp)
    out = proc.communicate(timeout=600)[0].decode()
    assert proc.returncode == 0, out[-4000:]


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process and every descendant (DDP workers leave the launcher's group)."""
    import psutil

    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.send_signal(signal.SIGKILL)
    proc.communicate()
    psutil.wait_procs(family, timeout=30)


def _kill_when(args: list[str], progress, more: int, after: float, ddp: bool = False) -> bool:
    """Start; once `progress()` (a count of things on disk) has grown by `more`, wait `after`
    seconds, then SIGKILL the whole tree. False if the command finished first."""
    start = progress()
    proc = _start(args, ddp)
    deadline = time.monotonic() + 600
    while proc.poll() is None and progress() < start + more and time.monotonic() < deadline:
        time.sleep(0.01)
    if after:
        time.sleep(after)
    if proc.poll() is not None:
        out = proc.communicate()[0].decode()
        assert proc.returncode == 0, out[-4000:]
        return False
    _kill_tree(proc)
    return True


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


def _draws(name: str, count: int, most: int, wait: float = 0.25) -> list[tuple[int, float]]:
    """Seeded kill points: (units of progress past the restart, extra seconds up to `wait`)."""
    draw = random.Random(name)
    return [(draw.randint(1, most), draw.uniform(0.0, wait)) for _ in range(count)]


@pytest.fixture(scope="module")
def chat(tmp_path_factory) -> Path:
    return write_chat_jsonl(tmp_path_factory.mktemp("fault-data") / "chat.jsonl", 24)


def _train_recipe(root: Path, target: Path, chat: Path) -> Path:
    train = {"max_steps": 14, "checkpoint_every": 2, "micro_batch_size": 2, "keep_checkpoints": 2}
    recipe = tiny_recipe(root, target, chat, train=train)
    return recipe_yaml(recipe, root.with_suffix(".yaml"))


@pytest.mark.parametrize("ddp", [False, True], ids=["one-process", "ddp"])
def test_train_killed_anywhere_resumes_to_identical_weights(testbed_tiny, chat, tmp_path, ddp):
    straight = _train_recipe(tmp_path / "straight", testbed_tiny[0], chat)
    _finish(["train", str(straight)], ddp)
    expected = load_file(tmp_path / "straight" / "drafter" / "model.safetensors")

    killed = _train_recipe(tmp_path / "killed", testbed_tiny[0], chat)
    drafter = tmp_path / "killed" / "drafter"
    steps = tmp_path / "killed" / "drafter.work" / "rows-rank0.jsonl"  # a line per step done
    name = f"train ({'DDP' if ddp else '1 process'})"
    for more, after in _draws(name, 2 if ddp else 3, 3):
        if _kill_when(["train", str(killed)], lambda: _lines(steps), more, after, ddp):
            assert not drafter.exists(), "killed before the export: nothing half-written"
            KILLS[name] += 1
    assert KILLS[name], "no kill landed before the end"
    _finish(["train", str(killed)], ddp)
    got = load_file(drafter / "model.safetensors")
    assert got.keys() == expected.keys()
    for key in expected:
        assert torch.equal(got[key], expected[key]), key


def _capture_args(root: Path, target: Path, chat: Path, shards: Path) -> list[str]:
    recipe = tiny_recipe(root, target, chat)
    path = recipe_yaml(recipe, root.with_suffix(".yaml"))
    return ["capture", str(path), "--dir", str(shards), "--set", "capture.shard_samples=2"]


def _valid_shards(folder: Path) -> list[dict]:
    """The listed shards, each checked against its sha256."""
    import hashlib

    index = folder / "index.json"
    if not index.is_file():
        return []
    shards = json.loads(index.read_text())["shards"]
    for shard in shards:
        digest = hashlib.sha256((folder / shard["file"]).read_bytes()).hexdigest()
        assert digest == shard["sha256"], shard["file"]
    return shards


def test_capture_killed_anywhere_keeps_only_checksummed_shards(testbed_tiny, chat, tmp_path):
    straight = tmp_path / "straight-shards"
    _finish(_capture_args(tmp_path / "a", testbed_tiny[0], chat, straight))
    killed = tmp_path / "killed-shards"
    args = _capture_args(tmp_path / "b", testbed_tiny[0], chat, killed)

    def shards() -> int:
        return len(list(killed.glob("shard-*"))) if killed.is_dir() else 0

    for more, after in _draws("capture", 3, 2, wait=0.02):  # a shard takes ~10 ms
        if _kill_when(args, shards, more, after):
            _valid_shards(killed)
            KILLS["capture"] += 1
    assert KILLS["capture"], "no kill landed before the end"
    _finish(args)
    expected, got = _valid_shards(straight), _valid_shards(killed)
    assert [s["sha256"] for s in got] == [s["sha256"] for s in expected]
    assert len(got) > 2


def _rows(path: Path) -> tuple[list[dict], bytes]:
    """(parsed complete lines, the bytes after the last newline)."""
    if not path.is_file():
        return [], b""
    data = path.read_bytes()
    complete, _, torn = data.rpartition(b"\n")
    return [json.loads(line) for line in complete.splitlines() if line], torn


def test_regenerate_killed_anywhere_keeps_every_finished_row(testbed_tiny, chat, tmp_path):
    recipe = recipe_yaml(tiny_recipe(tmp_path, testbed_tiny[0], chat), tmp_path / "r.yaml")
    words = ["--max-new-tokens", "12", "--batch-size", "2", "--limit", "16", "--sort-window", "1"]
    straight = tmp_path / "straight.jsonl"
    _finish(["regenerate", str(recipe), "--output", str(straight), *words])
    out = tmp_path / "killed.jsonl"
    args = ["regenerate", str(recipe), "--output", str(out), *words]
    for more, after in _draws("regenerate", 3, 2):
        before, _ = _rows(out)
        if _kill_when(args, lambda: _lines(out), more, after):
            after_kill, _ = _rows(out)
            assert after_kill[: len(before)] == before  # nothing written earlier was touched
            KILLS["regenerate"] += 1
    assert KILLS["regenerate"], "no kill landed before the end"
    _finish(args)
    rows, torn = _rows(out)
    assert torn == b""
    expected, _ = _rows(straight)
    assert len(rows) == len(expected) == 16
    assert [r["row"] for r in rows] == [r["row"] for r in expected]


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _measured(folder: Path, target_model, report_dir: Path) -> tuple[Path, Path]:
    """(drafter folder, its eval report): the drafter measured on 2 prompts."""
    from draftzoo.eval.runner import EvalConfig, evaluate, write_report
    from draftzoo.inference.load import load_drafter

    model, tokenizer, path = target_model
    drafter = load_drafter(folder, model, tokenizer, from_name("chain", 3))
    config = EvalConfig(
        max_prompts=2, max_new_tokens=12, temperatures=(0.0,), certificate_samples=300
    )
    report = evaluate(model, tokenizer, drafter, config, str(path), show_progress=False)
    return folder, write_report(report, report_dir)


@pytest.fixture(scope="module")
def publishable(tiny_drafters, tiny_target_model, tmp_path_factory):
    """The tiny EAGLE-3 and its eval report."""
    report_dir = tmp_path_factory.mktemp("fault-report")
    return _measured(tiny_drafters["eagle3"], tiny_target_model, report_dir)


@pytest.fixture(scope="module")
def other_publishable(tiny_drafters, tiny_target_model, tmp_path_factory):
    """Another checkpoint, the tiny EAGLE-1, and its eval report."""
    report_dir = tmp_path_factory.mktemp("fault-report-b")
    return _measured(tiny_drafters["eagle1"], tiny_target_model, report_dir)


def test_publish_killed_anywhere_leaves_the_zoo_whole(publishable, other_publishable, tmp_path):
    """`publish --overwrite` of a *different* checkpoint, killed anywhere: the entry is the old
    checkpoint or the new one, whole, and the index's hash is its folder's."""
    from draftzoo.architectures.drafter_io import checkpoint_hash
    from draftzoo.architectures.zoo_index import ZooIndex
    from draftzoo.eval.publish import publish

    folder, report = publishable
    zoo = tmp_path / "zoo"
    publish(folder, report, zoo, "keep-a")
    publish(folder, report, zoo, "keep-b")
    kept = {name: _tree(zoo / name) for name in ("keep-a", "keep-b")}
    entries = ZooIndex(zoo).entries()
    publish(folder, report, zoo, "entry")  # the old checkpoint
    hashes = {checkpoint_hash(folder), checkpoint_hash(other_publishable[0])}
    folder, report = other_publishable  # the new one
    args = ["publish", str(folder), "--report", str(report), "--zoo", str(zoo)]
    args += ["--name", "entry", "--overwrite"]

    seen: set[str] = set()  # each publish builds its entry in a new scratch folder

    def building() -> int:
        seen.update(p.name for p in zoo.glob(".entry.tmp-*"))
        return len(seen)

    for _, after in _draws("publish", 3, 1):
        if _kill_when(args, building, 1, after):
            now = ZooIndex(zoo).entries()  # parses: never half an index
            assert {k: now[k] for k in kept} == {k: entries[k] for k in kept}
            for name, files in kept.items():
                assert _tree(zoo / name) == files, name
            # old or new, the entry's folder is whole and the index names its weights
            assert now["entry"]["checkpoint_hash"] in hashes
            assert checkpoint_hash(ZooIndex(zoo).folder("entry")) == now["entry"]["checkpoint_hash"]
            KILLS["publish"] += 1
    assert KILLS["publish"], "no kill landed before the end"
    _finish(args)
    assert "entry" in ZooIndex(zoo).entries()
    # what killed publishes left is gone: the next publish deletes dead processes' scratch
    assert sorted(p.name for p in zoo.iterdir()) == [
        ".lock",
        "entry",
        "index.json",
        "keep-a",
        "keep-b",
    ]


def test_two_publishes_at_once_both_land(publishable, tmp_path):
    from draftzoo.architectures.zoo_index import ZooIndex

    folder, report = publishable
    zoo = tmp_path / "zoo"
    procs = [
        _start(["publish", str(folder), "--report", str(report), "--zoo", str(zoo), "--name", n])
        for n in ("first", "second")
    ]
    for proc in procs:
        out = proc.communicate(timeout=300)[0].decode()
        assert proc.returncode == 0, out
    entries = ZooIndex(zoo).entries()
    assert sorted(entries) == ["first", "second"]
    for name in entries:
        assert (ZooIndex(zoo).folder(name) / "README.md").is_file()


class _Faults:
    """Makes the n-th call of the patched file operations fail: once (`transient`), or that
    one and every later one (`persistent`, a disk that stays full)."""

    def __init__(self, monkeypatch, kind: str, at: int) -> None:
        import errno
        import os
        import shutil

        self.calls, self.fired = 0, False
        code = errno.ENOSPC if kind == "full disk" else errno.EIO
        names = {
            "rename": [(os, "replace")],
            "fsync": [(os, "fsync")],
            "full disk": [(shutil, "copyfile"), (os, "fsync")],
        }[kind]
        for module, name in names:
            real = getattr(module, name)
            monkeypatch.setattr(module, name, self._failing(real, at, code, kind == "full disk"))

    def _failing(self, real, at: int, code: int, persistent: bool):
        def call(*args, **kwargs):
            self.calls += 1
            if self.calls == at or (persistent and self.calls > at):
                self.fired = True
                raise OSError(code, "injected failure")
            return real(*args, **kwargs)

        return call


@pytest.mark.parametrize("kind", ["rename", "fsync", "full disk"])
def test_publish_overwrite_of_another_checkpoint_survives_failing_writes(
    kind, publishable, other_publishable, tiny_target_model, tmp_path, monkeypatch, capsys
):
    """`publish --overwrite` of a different checkpoint, with the n-th rename, fsync or file copy
    failing (n = 1, 2, ... until one publish gets through untouched): it exits 0, or 2 with one
    line; the index's hash is always the entry folder's weights (the old entry's when it
    failed), every command finds the entry, and no scratch folder or temporary index is left."""
    import draftzoo
    from draftzoo.architectures.drafter_io import checkpoint_hash
    from draftzoo.architectures.zoo_index import ZooIndex
    from draftzoo.cli import main
    from draftzoo.eval.publish import publish

    (old_folder, old_report), (new_folder, new_report) = publishable, other_publishable
    old_hash, new_hash = checkpoint_hash(old_folder), checkpoint_hash(new_folder)
    assert old_hash != new_hash
    target = str(tiny_target_model[2])
    for at in range(1, 60):
        zoo = tmp_path / f"zoo-{at}"
        publish(old_folder, old_report, zoo, "entry")
        args = ["publish", str(new_folder), "--report", str(new_report), "--zoo", str(zoo)]
        with monkeypatch.context() as patch:
            faults = _Faults(patch, kind, at)
            code = main([*args, "--name", "entry", "--overwrite"])
        errors = [x for x in capsys.readouterr().err.splitlines() if x.startswith("draftzoo")]
        index = ZooIndex(zoo)
        entry = index.entries()["entry"]
        assert checkpoint_hash(index.folder("entry")) == entry["checkpoint_hash"]
        if faults.fired:
            assert code == 2 and len(errors) == 1 and "injected failure" in errors[0]
            assert entry["checkpoint_hash"] == old_hash  # the old entry, whole
        else:
            assert code == 0 and entry["checkpoint_hash"] == new_hash
        assert main(["zoo", "list", "--zoo", str(zoo)]) == 0
        draftzoo.load("entry", target, zoos=[zoo])
        assert sorted(p.name for p in zoo.iterdir()) == [".lock", "entry", "index.json"]
        if not faults.fired:
            break
        KILLS[f"publish {kind} failure"] += 1
    else:
        raise AssertionError("the faults never stopped firing")
    assert KILLS[f"publish {kind} failure"] >= 1


def _on_full_disk(at: int, args: list[str]) -> tuple[int, dict, list[str]]:
    """Run `draftzoo args` in a subprocess whose AT-th tensor-file write and every later one
    fail with ENOSPC (tests/full_disk.py): (exit code, its write tally, its error lines)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.full_disk", str(at), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        cwd=Path(__file__).parents[1],
    )
    tally = json.loads(proc.stdout.strip().splitlines()[-1])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("draftzoo: error")]
    return proc.returncode, tally, errors


def _full_disk_train(at: int, recipe: Path, drafter: Path, work: Path) -> dict:
    """One `train` whose disk fills from the AT-th tensor write: it exits 0 (the disk never
    filled), or 2 with one error line, having left no drafter folder and only complete
    checkpoints; its write tally."""
    from draftzoo.train.checkpoint import CheckpointManager

    code, tally, errors = _on_full_disk(at, ["train", str(recipe)])
    if not tally["filled"]:
        assert code == 0, errors
        return tally
    assert code == 2 and len(errors) == 1 and "No space left on device" in errors[0], errors
    assert not drafter.exists(), "a failed export leaves no drafter folder"
    for checkpoint in CheckpointManager(work / "checkpoints").complete():
        assert (checkpoint / "model.safetensors").is_file(), checkpoint
    KILLS["train full disk"] += 1
    return tally


def test_train_on_a_disk_that_fills_fails_in_one_line_and_resumes_to_the_same_weights(
    testbed_tiny, chat, tmp_path
):
    """The disk fills at the 1st, 2nd, ... tensor write of each run in turn, every run resuming
    from what the last one finished, until one gets through; then, in a second folder, at the
    export's own write (the last of a run). Each failed run stops with one error line, takes no
    checkpoint it failed to finish for a complete one and leaves no drafter half-written; both
    folders end bit-identical to a straight run."""
    train = {"max_steps": 6, "checkpoint_every": 2, "micro_batch_size": 2, "keep_checkpoints": 2}

    def recipe(name: str) -> Path:
        made = tiny_recipe(tmp_path / name, testbed_tiny[0], chat, train=train)
        return recipe_yaml(made, tmp_path / f"{name}.yaml")

    _finish(["train", str(recipe("straight"))])
    expected = load_file(tmp_path / "straight" / "drafter" / "model.safetensors")
    chained = recipe("chained")
    for at in range(1, 100):
        tally = _full_disk_train(
            at, chained, tmp_path / "chained" / "drafter", tmp_path / "chained" / "drafter.work"
        )
        if not tally["filled"]:
            break
    else:
        raise AssertionError("the disk never stopped filling")
    assert KILLS["train full disk"] >= 3
    writes = _full_disk_train(
        10**9, recipe("probe"), tmp_path / "probe" / "drafter", tmp_path / "probe" / "drafter.work"
    )["writes"]
    export = recipe("export")
    drafter, work = tmp_path / "export" / "drafter", tmp_path / "export" / "drafter.work"
    assert _full_disk_train(writes, export, drafter, work)["filled"]  # the export's write
    _finish(["train", str(export)])
    for folder in ("chained", "probe", "export"):
        got = load_file(tmp_path / folder / "drafter" / "model.safetensors")
        assert got.keys() == expected.keys()
        for key in expected:
            assert torch.equal(got[key], expected[key]), (folder, key)


def test_capture_on_a_disk_that_fills_keeps_only_checksummed_shards(testbed_tiny, chat, tmp_path):
    """The disk fills at each shard write in turn: one error line each time, every listed shard
    matches its sha256, and the finished capture equals a straight one."""
    straight = tmp_path / "straight-shards"
    _finish(_capture_args(tmp_path / "a", testbed_tiny[0], chat, straight))
    shards = tmp_path / "full-shards"
    args = _capture_args(tmp_path / "b", testbed_tiny[0], chat, shards)
    for at in range(1, 100):
        code, tally, errors = _on_full_disk(at, args)
        _valid_shards(shards)
        if not tally["filled"]:
            assert code == 0
            break
        assert code == 2 and len(errors) == 1 and "No space left on device" in errors[0], errors
        KILLS["capture full disk"] += 1
    else:
        raise AssertionError("the disk never stopped filling")
    expected, got = _valid_shards(straight), _valid_shards(shards)
    assert [s["sha256"] for s in got] == [s["sha256"] for s in expected]
    assert KILLS["capture full disk"] >= 1
