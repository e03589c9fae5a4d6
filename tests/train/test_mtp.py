"""The MTP recipe: real steps on testbed-tiny, the depth-unrolled loss, export and load, resume,
offline capture, DDP, bad input."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from draftzoo.architectures.config_io import ConfigError, from_dict
from draftzoo.architectures.drafter_io import read_drafter_record
from draftzoo.architectures.mtp import build_mtp, load_mtp
from draftzoo.architectures.mtp_native import NativeMtpError
from draftzoo.data.batching import collate
from draftzoo.train.mtp import MtpRecipe, run
from draftzoo.train.mtp_loss import MtpLoss
from draftzoo.train.setup import load_target
from tests.train.helpers import (
    launch_two_processes,
    recipe_yaml,
    tiny_mtp_recipe,
    write_chat_jsonl,
)


@pytest.fixture(scope="module")
def chat(tmp_path_factory) -> Path:
    return write_chat_jsonl(tmp_path_factory.mktemp("chat") / "chat.jsonl", 48)


def test_d2_trains_exports_loads_back_and_resumes(testbed_tiny, chat, tmp_path):
    train = {"max_steps": 6, "lr": 3e-3, "log_every": 2, "checkpoint_every": 3}
    recipe = tiny_mtp_recipe(tmp_path, testbed_tiny[0], chat, mtp={"depth": 2}, train=train)
    result = run(recipe)
    folder = Path(recipe.output_dir)
    record = read_drafter_record(folder)
    target = load_target(recipe.target, "cpu")
    assert record["family"] == "mtp" and record["hidden_state_layers"] == [target.num_layers]
    assert len(record["training"]["depth_accuracy"]) == 2
    assert result.supervised_tokens > 0 and result.final_loss == result.final_loss
    drafter = load_mtp(folder, target)
    assert drafter.depth == 2 and drafter.fields["decoder_layer_class"] == "LlamaDecoderLayer"
    # the modules are their own; the target's embedding and head are never stored
    keys = set(load_file(folder / "model.safetensors"))
    assert "layers.1.eh_proj.weight" in keys and not any("embed" in k or "head" in k for k in keys)
    # a rerun resumes from the last checkpoint (step 3) and ends with the same weights
    first = load_file(folder / "model.safetensors")
    again = run(recipe)
    assert again.resumed_from == 3 and again.steps == 6
    second = load_file(folder / "model.safetensors")
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_loss_is_lambda_over_depth_times_each_depths_cross_entropy(testbed_tiny, chat, tmp_path):
    """The recipe's loss against a direct computation: (lambda / D) sum_k CE(x_{t+k+2})."""
    recipe = tiny_mtp_recipe(tmp_path, testbed_tiny[0], chat, mtp={"depth": 2, "loss_weight": 0.3})
    target = load_target(recipe.target, "cpu")
    torch.manual_seed(0)
    drafter = build_mtp(recipe.mtp, target)
    from draftzoo.data.capture import OnlineFeatures
    from draftzoo.data.token_dataset import build_token_dataset

    dataset, _, _ = build_token_dataset(recipe.data, target.tokenizer, tmp_path / "cache")
    batch = collate([dataset[i] for i in range(2)], target.tokenizer.pad_token_id or 0)
    features = OnlineFeatures(target, [target.num_layers], "float32")
    loss = MtpLoss(recipe.mtp, target, features)
    total, stats = loss(drafter, batch, loss.teacher(batch))
    # direct: unroll by hand on each row alone (no padding), depth k reading depth k - 1
    expected = torch.zeros(())
    for row in range(2):
        ids = batch.input_ids[row][batch.attention_mask[row].bool()]
        mask = batch.loss_mask[row][batch.attention_mask[row].bool()].bool()
        n = len(ids)
        with torch.no_grad():
            states = target.model(ids[None], output_hidden_states=True).hidden_states[-1]
        previous = states
        causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
        for k in range(2):
            shifted = torch.cat([ids[k + 1 :], ids.new_zeros(k + 1)])[None]
            previous = drafter.module(k, shifted, previous, torch.arange(n)[None] + k, causal)
            t = torch.arange(n - k - 2)
            keep = mask[t + k + 2]
            logits = drafter.logits(previous[0, t[keep]])
            expected = expected + F.cross_entropy(logits, ids[t[keep] + k + 2], reduction="sum")
    torch.testing.assert_close(total, expected * 0.3 / 2, rtol=2e-4, atol=2e-3)
    assert set(stats) == {"acc_0", "acc_1", "loss_0", "loss_1"}


def test_offline_capture_trains_like_online_and_ddp_ranks_agree(testbed_tiny, chat, tmp_path):
    from draftzoo.cli import main

    online = tiny_mtp_recipe(tmp_path / "on", testbed_tiny[0], chat, train={"max_steps": 2})
    first = run(online).final_loss
    path = recipe_yaml(online, tmp_path / "r.yaml")
    shards = tmp_path / "shards"
    assert main(["capture", str(path), "--dir", str(shards)]) == 0
    assert json.loads((shards / "index.json").read_text())["layers"] == [2]  # the final state
    offline = replace(
        online,
        output_dir=str(tmp_path / "off" / "drafter"),
        capture=replace(online.capture, mode="offline", dir=str(shards)),
    )
    assert abs(first - run(offline).final_loss) / first < 1e-3
    ddp = tiny_mtp_recipe(
        tmp_path / "ddp",
        testbed_tiny[0],
        chat,
        mtp={"depth": 2},
        train={"max_steps": 2, "micro_batch_size": 2, "checkpoint_every": 10},
    )
    proc = launch_two_processes(recipe_yaml(ddp, tmp_path / "ddp.yaml"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    work = Path(f"{ddp.output_dir}.work")
    digests = json.loads((work / "replicas.json").read_text())["digests"]
    assert len(digests) == 2 and digests[0] == digests[1]


def test_bad_mtp_input_is_refused_before_step_one(testbed_tiny, chat, tmp_path):
    data = {"source": str(chat)}
    with pytest.raises(ConfigError, match="depth must be >= 1"):
        from_dict(MtpRecipe, {"family": "mtp", "data": data, "mtp": {"depth": 0}})
    with pytest.raises(ConfigError, match="init_from"):
        from_dict(MtpRecipe, {"family": "mtp", "data": data, "mtp": {"init_from": "hub"}})
    # testbed-tiny ships no MTP modules: `init_from: native` says so, nothing is written
    recipe = tiny_mtp_recipe(tmp_path, testbed_tiny[0], chat, mtp={"init_from": "native"})
    with pytest.raises(NativeMtpError, match="ships no MTP modules"):
        run(recipe)
    assert not Path(recipe.output_dir).exists()


def test_recipes_check_on_the_meta_device():
    from draftzoo.train.registry import check_recipe, load_recipe

    root = Path(__file__).parents[2] / "recipes" / "mtp"
    for name, depth in (("testbed-small.yaml", 1), ("testbed-small-d2.yaml", 2)):
        summary = check_recipe(load_recipe(root / name))
        assert summary["depth"] == depth and summary["hidden_state_layers"] == [12]
    summary = check_recipe(load_recipe(root / "deepseek-v3.yaml"))
    assert summary["decoder_layer_class"] == "DeepseekV3DecoderLayer"
    assert summary["hidden_state_layers"] == [61]
