"""One long "wsd" run, shorter budgets branched from its pinned checkpoints (`train.start_from`):
each branch trains exactly as a run of its own budget would."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftzoo.train.eagle import run
from draftzoo.train.schedules import decay_start, lr_lambda
from draftzoo.train.setup import work_dir_of
from draftzoo.train.start_from import StartFromError
from tests.train.helpers import recipe_yaml, tiny_eagle_recipe, write_chat_jsonl


@pytest.fixture(scope="module")
def chat(tmp_path_factory) -> Path:
    return write_chat_jsonl(tmp_path_factory.mktemp("chat") / "chat.jsonl", 48)


def test_wsd_warms_up_holds_then_decays_and_a_shorter_budget_shares_its_start():
    long, short = lr_lambda("wsd", 10, 1000, 0.1, 0.2), lr_lambda("wsd", 10, 200, 0.1, 0.2)
    assert [long(s) for s in (0, 9)] == [0.1, 1.0]
    assert decay_start(1000, 0.2) == 800 and long(800) == 1.0 and long(799) == 1.0
    assert long(900) == pytest.approx(0.55) and long(1000) == pytest.approx(0.1)
    # up to the short budget's decay the two schedules are one: the branch point
    assert all(long(s) == short(s) for s in range(decay_start(200, 0.2) + 1))
    assert short(180) == pytest.approx(0.55)


def test_a_budget_branched_from_a_longer_run_trains_as_it_would_alone(testbed_tiny, chat, tmp_path):
    """6-step run, decay over its last half, a checkpoint every step, the newest 2 kept and
    step 2 pinned; a 4-step budget (decay from step 2) started from that checkpoint ends with
    the weights of a 4-step run on its own."""
    wsd = {"schedule": "wsd", "decay_fraction": 0.5, "warmup_steps": 1}
    long = tiny_eagle_recipe(
        tmp_path / "long",
        testbed_tiny[0],
        chat,
        train={**wsd, "max_steps": 6, "checkpoint_every": 1, "checkpoint_steps": [2]},
    )
    run(long)
    kept = sorted(p.name for p in (work_dir_of(long) / "checkpoints").iterdir())
    assert kept == ["step-2", "step-4", "step-5"]
    pinned = work_dir_of(long) / "checkpoints" / "step-2"
    assert json.loads((pinned / "progress.json").read_text())["step"] == 2
    short = {**wsd, "max_steps": 4, "checkpoint_every": 100}
    alone = run(tiny_eagle_recipe(tmp_path / "alone", testbed_tiny[0], chat, train=short))
    branch = tiny_eagle_recipe(
        tmp_path / "branch", testbed_tiny[0], chat, train={**short, "start_from": str(pinned)}
    )
    branched = run(branch)
    assert branched.resumed_from == 2 and branched.steps == 4
    assert branched.supervised_tokens == alone.supervised_tokens
    mine, theirs = (load_file(Path(r.output_dir) / "model.safetensors") for r in (branch, alone))
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    record = json.loads((Path(branch.output_dir) / "draftzoo.json").read_text())
    assert record["training"]["started_from"] == {"checkpoint": str(pinned), "step": 2}


def test_start_from_refuses_what_it_cannot_continue_in_one_line(testbed_tiny, chat, tmp_path):
    """Not a checkpoint, a step at or past the budget, another run's data: refused at set-up,
    one line from the CLI, no run folder left behind."""
    from draftzoo.cli import main

    first = tiny_eagle_recipe(tmp_path / "first", testbed_tiny[0], chat)
    run(first)
    done = work_dir_of(first) / "checkpoints" / "step-1"
    other_chat = write_chat_jsonl(tmp_path / "other.jsonl", 24)
    cases = {
        "no progress.json": (str(tmp_path), chat, "not a complete checkpoint"),
        "past the budget": (str(done), chat, "at step 1: not before train.max_steps 1"),
        "other data": (str(done), other_chat, "was trained on other data"),
    }
    for name, (start_from, data, message) in cases.items():
        steps = 1 if name == "past the budget" else 2
        recipe = tiny_eagle_recipe(
            tmp_path / name.replace(" ", "-"),
            testbed_tiny[0],
            data,
            train={"start_from": start_from, "max_steps": steps, "warmup_steps": 0},
        )
        with pytest.raises(StartFromError, match=message):
            run(recipe)
        assert not work_dir_of(recipe).exists() and not Path(recipe.output_dir).exists()
    bad = replace(recipe, train=replace(recipe.train, start_from=str(tmp_path / "absent")))
    path = recipe_yaml(bad, tmp_path / "bad.yaml")
    assert main(["train", str(path)]) == 2


def test_train_rows_draws_every_step_from_the_first_rows_only(testbed_tiny, chat, tmp_path):
    """`train.rows`: more passes over less text at one budget (the ablation of passes); the
    data and its hash stay the whole set's; more rows than the data holds is refused."""
    from draftzoo.train.blocks import TrainRowsError

    recipe = tiny_eagle_recipe(tmp_path / "few", testbed_tiny[0], chat, train={"rows": 4})
    result = run(recipe)
    seen = [json.loads(line) for line in (work_dir_of(recipe) / "rows-rank0.jsonl").open()]
    assert [sorted(r for micro in s["rows"] for r in micro) for s in seen] == [[0, 1, 2, 3]] * 2
    assert result.data_passes == 2.0
    whole = tiny_eagle_recipe(tmp_path / "all", testbed_tiny[0], chat)
    record = json.loads((Path(recipe.output_dir) / "draftzoo.json").read_text())
    run(whole)
    assert (
        record["data_hash"]
        == json.loads((Path(whole.output_dir) / "draftzoo.json").read_text())["data_hash"]
    )
    too_many = tiny_eagle_recipe(tmp_path / "many", testbed_tiny[0], chat, train={"rows": 10_000})
    with pytest.raises(TrainRowsError, match="more than the"):
        run(too_many)
