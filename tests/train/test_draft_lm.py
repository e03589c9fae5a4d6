"""The draft-LM recipe: real steps, global-count normalisation, export, resume, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftzoo.architectures.config_io import ConfigError
from draftzoo.architectures.drafter_io import check_drafter_target, read_drafter_record
from draftzoo.architectures.target import FingerprintMismatchError, TargetError
from draftzoo.train.draft_lm import run
from draftzoo.train.registry import load_recipe
from draftzoo.train.setup import load_target
from tests.train.helpers import launch_two_processes, recipe_yaml, tiny_recipe, write_chat_jsonl


@pytest.fixture(scope="module")
def chat(tmp_path_factory) -> Path:
    return write_chat_jsonl(tmp_path_factory.mktemp("chat") / "chat.jsonl", 48)


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def test_two_steps_train_export_and_record(testbed_tiny, chat, tmp_path):
    recipe = tiny_recipe(tmp_path, testbed_tiny[0], chat)
    result = run(recipe)
    assert result.steps == 2 and result.resumed_from == 0
    assert result.supervised_tokens > 0 and 0 < result.final_loss < 20
    folder = Path(recipe.output_dir)
    assert {"config.json", "model.safetensors", "draftzoo.json"} <= {
        p.name for p in folder.iterdir()
    }
    record = read_drafter_record(folder)
    assert record["family"] == "draft_lm" and record["training"]["steps"] == 2
    assert result.data_passes > 0
    assert record["training"]["data_passes"] == pytest.approx(result.data_passes, abs=1e-4)
    assert record["recipe"]["distill"]["loss"] == "fkl" and len(record["data_hash"]) == 16
    target = load_target(recipe.target, "cpu")
    check_drafter_target(folder, target.fingerprint())
    with pytest.raises(FingerprintMismatchError, match="num_layers"):
        check_drafter_target(folder, replace(target.fingerprint(), num_layers=32))
    from transformers import AutoModelForCausalLM

    draft = AutoModelForCausalLM.from_pretrained(folder)
    assert draft.config.vocab_size == target.config.vocab_size
    # the exported weights differ from a fresh init: two real optimizer steps happened
    fresh = tiny_recipe(
        tmp_path / "fresh", testbed_tiny[0], chat, train={"max_steps": 2, "lr": 0.0}
    )
    run(fresh)
    trained, untouched = weights(folder), weights(Path(fresh.output_dir))
    assert any(not torch.equal(trained[k], untouched[k]) for k in trained)


def test_loss_is_normalised_by_the_global_supervised_count(testbed_tiny, chat, tmp_path):
    """One step over 4 rows equals two accumulated micro-batches of 2 (same rows, same order)."""
    whole = tiny_recipe(
        tmp_path / "a",
        testbed_tiny[0],
        chat,
        train={"micro_batch_size": 4, "grad_accum": 1, "max_steps": 2},
    )
    split = tiny_recipe(
        tmp_path / "b",
        testbed_tiny[0],
        chat,
        train={"micro_batch_size": 2, "grad_accum": 2, "max_steps": 2},
    )
    a, b = run(whole), run(split)
    assert a.supervised_tokens == b.supervised_tokens
    assert a.final_loss == pytest.approx(b.final_loss, rel=1e-5)
    wa, wb = weights(Path(whole.output_dir)), weights(Path(split.output_dir))
    for name in wa:
        torch.testing.assert_close(wa[name].float(), wb[name].float(), atol=1e-2, rtol=0)


def test_label_only_baseline_needs_no_target_logits(testbed_tiny, chat, tmp_path):
    recipe = tiny_recipe(tmp_path, testbed_tiny[0], chat, distill={"loss": "ce"})
    result = run(recipe)
    assert 0 < result.final_loss < 20
    assert read_drafter_record(Path(recipe.output_dir))["recipe"]["distill"]["loss"] == "ce"


def _launch(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "draftzoo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def test_sigkill_mid_run_resumes_to_identical_weights(testbed_tiny, chat, tmp_path):
    base = dict(train={"max_steps": 8, "checkpoint_every": 2, "micro_batch_size": 2})
    straight = tiny_recipe(tmp_path / "straight", testbed_tiny[0], chat, **base)
    # launched the same way as the killed run: float32 sums can depend on the thread count
    done = _launch(["train", str(recipe_yaml(straight, tmp_path / "straight.yaml"))])
    assert done.wait(timeout=300) == 0
    killed = tiny_recipe(tmp_path / "killed", testbed_tiny[0], chat, **base)
    path = recipe_yaml(killed, tmp_path / "killed.yaml")
    checkpoints = Path(f"{killed.output_dir}.work") / "checkpoints"
    proc = _launch(["train", str(path)])
    deadline = time.time() + 240
    while not (checkpoints / "step-4").is_dir() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not Path(killed.output_dir).exists(), "killed before the end: nothing exported"
    resumed = _launch(["train", str(path)])
    out = resumed.communicate(timeout=300)[0].decode()
    assert resumed.returncode == 0, out
    step = int(out.split("resumed from step ")[1].split(")")[0])
    assert step >= 4
    a, b = weights(Path(straight.output_dir)), weights(Path(killed.output_dir))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_interrupted_save_never_leaves_a_loadable_checkpoint(testbed_tiny, chat, tmp_path):
    from draftzoo.train.checkpoint import CheckpointManager

    recipe = tiny_recipe(tmp_path, testbed_tiny[0], chat, train={"max_steps": 3})
    run(recipe)
    manager = CheckpointManager(Path(f"{recipe.output_dir}.work") / "checkpoints")
    latest, progress = manager.latest()
    assert latest.name == "step-2" and progress["step"] == 2
    # the schedule is JSON beside the step; no pickle that would load with weights_only=False
    assert progress["scheduler"]["last_epoch"] == 2
    assert not list(latest.glob("custom_checkpoint_*"))
    # what a kill during save_state leaves: a half-written folder under the temporary name
    partial = manager.root / ".step-3.a1b2c3d4.tmp"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    # and a renamed-looking folder without its progress record is not complete either
    (manager.root / "step-9").mkdir()
    assert manager.latest()[0].name == "step-2"
    manager.clean_partial()
    assert not partial.exists()


def test_distributed_ranks_see_different_rows_and_hold_identical_weights(
    testbed_tiny, chat, tmp_path
):
    recipe = tiny_recipe(
        tmp_path,
        testbed_tiny[0],
        chat,
        train={"max_steps": 3, "micro_batch_size": 2, "checkpoint_every": 10},
    )
    path = recipe_yaml(recipe, tmp_path / "ddp.yaml")
    proc = launch_two_processes(path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    work = Path(f"{recipe.output_dir}.work")
    seen = [
        [
            json.loads(line)["rows"]
            for line in (work / f"rows-rank{r}.jsonl").read_text().splitlines()
        ]
        for r in (0, 1)
    ]
    for step in range(3):
        rank0 = {i for micro in seen[0][step] for i in micro}
        rank1 = {i for micro in seen[1][step] for i in micro}
        assert rank0 and rank1 and not rank0 & rank1
    digests = json.loads((work / "replicas.json").read_text())["digests"]
    assert len(digests) == 2 and digests[0] == digests[1]
    record = read_drafter_record(Path(recipe.output_dir))
    assert record["training"]["num_processes"] == 2
    assert record["training"]["replica_digests_equal"] is True


def test_bad_recipes_and_checkpoints_are_clear_errors(testbed_tiny, chat, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("family: draft_lm\ndata: {source: x.jsonl}\ntrain: {max_stepz: 3}\n")
    with pytest.raises(ConfigError, match="max_stepz"):
        load_recipe(path)
    path.write_text("family: medusa-9\n")
    with pytest.raises(ConfigError, match=r"unknown drafter family 'medusa-9'; known: .*draft_lm"):
        load_recipe(path)
    path.write_text("family: draft_lm\n")
    with pytest.raises(ConfigError, match=r"data\.source is required"):
        load_recipe(path)
    with pytest.raises(ConfigError, match="override"):
        load_recipe(tmp_path / "r.yaml", ["train.max_steps"])
    # a starting checkpoint with another vocabulary
    from tests.conftest import tiny_causal_lm

    other = tmp_path / "other-vocab"
    tiny_causal_lm("llama", vocab_size=96).save_pretrained(other)
    recipe = tiny_recipe(tmp_path, testbed_tiny[0], chat, draft={"init_from": str(other)})
    with pytest.raises(TargetError, match="vocabulary 96"):
        run(recipe)


def test_trackers_log_to_tensorboard_and_offline_wandb(testbed_tiny, chat, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    recipe = tiny_recipe(
        tmp_path, testbed_tiny[0], chat, train={"log_with": ["tensorboard", "wandb"]}
    )
    run(recipe)
    work = Path(f"{recipe.output_dir}.work")
    assert os.environ["WANDB_MODE"] == "offline"
    assert list(work.rglob("events.out.tfevents.*")), "no tensorboard event file"
    assert list((work / "wandb").glob("offline-run-*")), "no offline wandb run"
    with pytest.raises(ConfigError, match="unknown tracker"):
        tiny_recipe(tmp_path / "x", testbed_tiny[0], chat, train={"log_with": ["mlflw"]})
