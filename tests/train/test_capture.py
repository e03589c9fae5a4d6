"""Online and offline capture: same features and loss; shards resumable, checked, refused."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from draftzoo.architectures.draft_lm import build_draft_lm
from draftzoo.architectures.target import FingerprintMismatchError, TargetFingerprint
from draftzoo.data.batching import collate
from draftzoo.data.capture import (
    CaptureConfig,
    CaptureError,
    OfflineFeatures,
    OnlineFeatures,
    capture_offline,
    estimate_bytes,
)
from draftzoo.data.token_dataset import build_token_dataset
from draftzoo.train.draft_lm_loss import DraftLMLoss
from draftzoo.train.setup import load_target
from tests.train.helpers import tiny_recipe, write_chat_jsonl


@pytest.fixture(scope="module")
def setup(testbed_tiny, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("capture")
    data = write_chat_jsonl(tmp / "chat.jsonl", 20)
    recipe = tiny_recipe(tmp, testbed_tiny[0], data, data={"max_length": 256})
    target = load_target(recipe.target, "cpu")
    dataset, _, key = build_token_dataset(recipe.data, target.tokenizer, tmp / "cache")
    return tmp, recipe, target, dataset, key


def test_online_and_offline_features_give_the_same_loss(setup):
    tmp, recipe, target, dataset, key = setup
    layers = [1, target.num_layers]
    assert len(dataset) >= 14
    config = CaptureConfig(mode="offline", dir=str(tmp / "shards"), shard_samples=6, batch_size=4)
    index = capture_offline(target, dataset, layers, tmp / "shards", config, key, 0)
    assert len(index["shards"]) == -(-len(dataset) // 6) and sum(
        s["count"] for s in index["shards"]
    ) == len(dataset)
    assert index["shards"][-1]["tokens"] > 0 and len(index["shards"][0]["sha256"]) == 64
    offline = OfflineFeatures(tmp / "shards", layers)
    offline.check(target.fingerprint(), key)
    online = OnlineFeatures(target, layers, torch.bfloat16)
    batch = collate([dataset[i] for i in (7, 2, 13)], 0)  # another grouping than at capture
    got, want = offline(batch), online(batch)
    for layer in layers:
        real = batch.attention_mask.bool()
        torch.testing.assert_close(
            got[layer][real].float(), want[layer][real].float(), atol=2e-2, rtol=1e-2
        )
    torch.manual_seed(0)
    draft = build_draft_lm(recipe.draft, target.model)
    loss = DraftLMLoss(recipe.distill, target, features=None)
    loss_offline = loss(draft, batch, got)[0]
    loss_online = loss(draft, batch, want)[0]
    count = batch.supervised_targets().sum()
    assert abs(loss_offline - loss_online) / count < 1e-3  # bf16 rounding of the states
    expected = estimate_bytes(dataset, target.hidden_size, layers, torch.bfloat16)
    stored = sum(s["tokens"] for s in index["shards"]) * target.hidden_size * 2 * 2
    assert expected == stored


def test_capture_resumes_and_recaptures_a_corrupt_shard(setup):
    tmp, _recipe, target, dataset, key = setup
    out = tmp / "resume"
    config = CaptureConfig(mode="offline", dir=str(out), shard_samples=3, batch_size=2)
    first = capture_offline(target, dataset, [target.num_layers], out, config, key, 0)
    kept = (out / "shard-00000.safetensors").stat().st_mtime_ns
    (out / "shard-00002.safetensors").write_bytes(b"torn write")
    (out / "shard-00003.safetensors").unlink()
    again = capture_offline(target, dataset, [target.num_layers], out, config, key, 0)
    assert (out / "shard-00000.safetensors").stat().st_mtime_ns == kept
    assert [s["sha256"] for s in again["shards"]] == [s["sha256"] for s in first["shards"]]
    with pytest.raises(CaptureError, match="other data, layers or target"):
        capture_offline(target, dataset, [1], out, config, key, 0)


def test_offline_features_refuse_other_targets_data_and_layers(setup):
    tmp, _recipe, target, dataset, key = setup
    out = tmp / "refuse"
    config = CaptureConfig(mode="offline", dir=str(out), shard_samples=50)
    capture_offline(target, dataset, [target.num_layers], out, config, key, 0)
    features = OfflineFeatures(out, [target.num_layers])
    other = replace(target.fingerprint(), hidden_size=4096)
    with pytest.raises(FingerprintMismatchError, match="hidden_size: 64 != 4096"):
        features.check(other, key)
    with pytest.raises(CaptureError, match="captured from data"):
        features.check(target.fingerprint(), "0" * 16)
    with pytest.raises(CaptureError, match="not \\[0\\]"):
        OfflineFeatures(out, [0])
    index = json.loads((out / "index.json").read_text())
    index["shards"] = index["shards"][:0]
    (out / "index.json").write_text(json.dumps(index))
    with pytest.raises(CaptureError, match="incomplete"):
        OfflineFeatures(out, [target.num_layers])
    assert isinstance(TargetFingerprint.from_dict(index["target"]), TargetFingerprint)
