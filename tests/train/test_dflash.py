"""The DFlash recipe: real steps on testbed-tiny, the block loss against a direct block-by-block
computation, export and load, exact resume, offline capture, DDP, bad input."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from draftzoo.architectures.config_io import ConfigError, from_dict
from draftzoo.architectures.dflash import DflashConfig, build_dflash, load_dflash
from draftzoo.architectures.drafter_io import read_drafter_record
from draftzoo.architectures.target import TargetError
from draftzoo.data.batching import collate
from draftzoo.data.capture import OnlineFeatures
from draftzoo.data.token_dataset import build_token_dataset
from draftzoo.train.dflash import DflashRecipe, check_on_meta, run
from draftzoo.train.dflash_loss import DflashLoss, block_plan
from draftzoo.train.setup import load_target
from tests.train.helpers import (
    launch_two_processes,
    recipe_yaml,
    tiny_dflash_recipe,
    write_chat_jsonl,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chat(tmp_path_factory) -> Path:
    return write_chat_jsonl(tmp_path_factory.mktemp("chat") / "chat.jsonl", 48)


def test_trains_exports_loads_back_and_resumes_exactly(testbed_tiny, chat, tmp_path):
    train = {"max_steps": 6, "lr": 3e-3, "log_every": 2, "checkpoint_every": 3}
    recipe = tiny_dflash_recipe(tmp_path, testbed_tiny[0], chat, train=train)
    result = run(recipe)
    folder = Path(recipe.output_dir)
    record = read_drafter_record(folder)
    target = load_target(recipe.target, "cpu")
    assert record["family"] == "dflash"
    assert record["hidden_state_layers"] == [target.num_layers // 2 + 1]  # the reference tap
    assert len(record["training"]["slot_accuracy"]) == 3
    assert 1 <= record["training"]["block_tau"] <= 4
    assert result.supervised_tokens > 0 and result.final_loss == result.final_loss
    drafter = load_dflash(folder, target)
    assert drafter.block_size == 4 and drafter.mask_token_id == 0
    # the drafter's own weights in z-lab's names; the target's embedding and head never stored
    keys = set(load_file(folder / "model.safetensors"))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= keys
    assert "layers.0.self_attn.q_norm.weight" in keys
    assert not any("embed" in k or "head" in k or "rotary" in k for k in keys)
    # a rerun resumes from step 3, draws the same blocks and ends with the same weights
    first = load_file(folder / "model.safetensors")
    again = run(recipe)
    assert again.resumed_from == 3 and again.steps == 6
    second = load_file(folder / "model.safetensors")
    assert all(torch.equal(first[k], second[k]) for k in first)


def _batch_and_loss(recipe, tmp_path, **dflash):
    target = load_target(recipe.target, "cpu")
    config = replace(recipe.dflash, **dflash)
    torch.manual_seed(0)
    drafter = build_dflash(config, target)
    dataset, _, _ = build_token_dataset(recipe.data, target.tokenizer, tmp_path / "cache")
    batch = collate([dataset[i] for i in range(2)], target.tokenizer.pad_token_id or 0)
    layers = sorted({*drafter.taps, target.num_layers})
    loss = DflashLoss(config, drafter, target, OnlineFeatures(target, layers, "float32"), 0)
    return target, drafter, batch, loss


@pytest.mark.parametrize("token_loss", ["ce", "hard"])
def test_the_loss_equals_blocks_drafted_one_by_one(testbed_tiny, chat, tmp_path, token_loss):
    """All blocks in one masked forward give, for every supervised slot, what drafting that
    block alone from its context computes (the runtime's path), weighted exp(-(i-1)/gamma)."""
    recipe = tiny_dflash_recipe(tmp_path, testbed_tiny[0], chat)
    target, drafter, batch, loss = _batch_and_loss(
        recipe, tmp_path, token_loss=token_loss, loss_decay=2.0
    )
    total, stats = loss(drafter, batch, loss.teacher(batch))
    plan = loss.plan(batch)
    assert int(loss.supervised(batch)) == int(plan.slots.sum()) > 0
    expected, count = torch.zeros(()), 0
    for row in range(2):
        ids = batch.input_ids[row][batch.attention_mask[row].bool()]
        with torch.no_grad():
            out = target.model(ids[None], output_hidden_states=True)
        states = torch.cat([out.hidden_states[k] for k in drafter.taps], dim=-1)
        for j in torch.nonzero(plan.valid[row], as_tuple=True)[0].tolist():
            a = int(plan.anchors[row, j])
            context = drafter.context(states[:, :a])
            entries = drafter.entries(context, torch.arange(a)[None])
            block = drafter.block_inputs(ids[a : a + 1])
            hidden = drafter.run_block(block, torch.arange(a, a + 4)[None], entries, None)
            logits = drafter.logits(hidden[0, 1:]).float()
            for i in range(1, 4):
                if not plan.slots[row, j, i - 1]:
                    continue
                if token_loss == "ce":
                    p = torch.softmax(out.logits[0, a + i - 1].float(), -1)
                    value = -(p * F.log_softmax(logits[i - 1], -1)).sum()
                else:
                    value = F.cross_entropy(logits[i - 1], ids[a + i])
                expected = expected + value * torch.exp(torch.tensor(-(i - 1) / 2.0))
                count += 1
    assert count == int(plan.slots.sum())
    torch.testing.assert_close(total, expected, atol=1e-4, rtol=1e-4)
    assert set(stats) >= {"acc_1", "acc_3", "loss_2", "block_tau"}


def test_anchors_are_drawn_where_the_next_token_is_supervised_and_repeat_by_seed(
    testbed_tiny, chat, tmp_path
):
    recipe = tiny_dflash_recipe(tmp_path, testbed_tiny[0], chat)
    _, _, batch, _ = _batch_and_loss(recipe, tmp_path)
    plan = block_plan(batch, 4, 8, seed=5)
    again = block_plan(batch, 4, 8, seed=5)
    other = block_plan(batch, 4, 8, seed=6)
    assert torch.equal(plan.anchors, again.anchors) and not torch.equal(plan.anchors, other.anchors)
    for row in range(2):
        anchors = plan.anchors[row][plan.valid[row]]
        assert len(anchors) == 8 and torch.equal(anchors, anchors.sort().values)
        assert batch.loss_mask[row][anchors + 1].all()  # x_{a+1} supervised
        assert (batch.position_ids[row][anchors] >= 1).all()


def test_offline_capture_trains_like_online_and_ddp_ranks_agree(testbed_tiny, chat, tmp_path):
    from draftzoo.cli import main

    online = tiny_dflash_recipe(tmp_path / "on", testbed_tiny[0], chat, train={"max_steps": 2})
    first = run(online).final_loss
    path = recipe_yaml(online, tmp_path / "r.yaml")
    shards = tmp_path / "shards"
    assert main(["capture", str(path), "--dir", str(shards)]) == 0
    # the reference tap of a 2-layer target is its last layer's output: the final state
    assert json.loads((shards / "index.json").read_text())["layers"] == [2]
    offline = replace(
        online,
        output_dir=str(tmp_path / "off" / "drafter"),
        capture=replace(online.capture, mode="offline", dir=str(shards)),
    )
    assert abs(first - run(offline).final_loss) / first < 1e-3
    ddp = tiny_dflash_recipe(
        tmp_path / "ddp",
        testbed_tiny[0],
        chat,
        train={"max_steps": 2, "micro_batch_size": 2, "checkpoint_every": 10},
    )
    proc = launch_two_processes(recipe_yaml(ddp, tmp_path / "ddp.yaml"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    work = Path(f"{ddp.output_dir}.work")
    digests = json.loads((work / "replicas.json").read_text())["digests"]
    assert len(digests) == 2 and len(set(digests)) == 1


def test_big_recipes_fit_on_the_meta_device():
    from draftzoo.train.registry import load_recipe
    from draftzoo.train.setup import model_config

    for name, taps in (
        ("qwen3-8b", [2, 10, 18, 26, 34]),
        ("llama-3.1-8b-instruct", [2, 9, 16, 23, 30]),
    ):
        recipe = load_recipe(REPO / "recipes" / "dflash" / f"{name}.yaml")
        report = check_on_meta(recipe, model_config(recipe.target.path))
        assert report["hidden_state_layers"] == taps and report["draft_layers"] == 5
        assert 0.9e9 < report["drafter_parameters"] < 1.3e9


def test_bad_settings_are_refused(testbed_tiny, chat, tmp_path):
    with pytest.raises(ConfigError, match="block_size must be >= 2"):
        from_dict(DflashRecipe, {"dflash": {"block_size": 1}})
    with pytest.raises(ConfigError, match="token_loss"):
        from_dict(DflashRecipe, {"dflash": {"token_loss": "kl"}})
    recipe = tiny_dflash_recipe(tmp_path, testbed_tiny[0], chat, dflash={"mask_token_id": None})
    target = load_target(recipe.target, "cpu")
    with pytest.raises(TargetError, match="no mask token"):
        build_dflash(recipe.dflash, target)
    with pytest.raises(TargetError, match="do not exist"):
        build_dflash(DflashConfig(layers=(99,), mask_token_id=0), target)


def test_its_training_tokens_count_positions_as_the_other_families_do(testbed_tiny, chat, tmp_path):
    """The loss is normalised by drafted slots, but the record's `supervised_tokens` counts the
    supervised positions an MTP run on the same rows counts, so the leaderboard's budgets
    compare."""
    from draftzoo.train.mtp import run as run_mtp
    from tests.train.helpers import tiny_mtp_recipe

    train = {"max_steps": 2}
    dflash = run(tiny_dflash_recipe(tmp_path / "dflash", testbed_tiny[0], chat, train=train))
    mtp = run_mtp(tiny_mtp_recipe(tmp_path / "mtp", testbed_tiny[0], chat, train=train))
    assert dflash.supervised_tokens == mtp.supervised_tokens > 0
