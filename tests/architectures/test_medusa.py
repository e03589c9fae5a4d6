"""Medusa heads: independent residual blocks, identity at start, save/load refusals, and the
vLLM export held to vLLM's own parameter list and config parsing."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from draftzoo.architectures.drafter_io import DrafterError, save_drafter
from draftzoo.architectures.export import ExportError, export_drafter
from draftzoo.architectures.medusa import MedusaConfig, build_medusa, load_medusa
from draftzoo.architectures.target import FingerprintMismatchError, TargetAdapter
from tests.conftest import tiny_causal_lm


@pytest.fixture
def target():
    return TargetAdapter(tiny_causal_lm("llama"))


def _saved(heads, target, path):
    return save_drafter(heads, path, "medusa1", target.fingerprint(), {}, "hash", layers=[3])


def test_each_block_and_head_holds_its_own_weights(target):
    heads = build_medusa(MedusaConfig(num_heads=3, num_layers=2), target)
    linears = [layer for block in heads.blocks for layer in block.layers]
    assert len(linears) == 6
    assert len({layer.weight.data_ptr() for layer in linears}) == 6
    assert len({head.weight.data_ptr() for head in heads.lm_heads}) == 3
    with torch.no_grad():
        heads.blocks[0].layers[0].weight.fill_(1.0)
    assert not heads.blocks[0].layers[1].weight.any()  # a shared object would have changed
    assert not heads.blocks[1].layers[0].weight.any()


def test_untrained_heads_predict_what_the_target_predicts(target):
    heads = build_medusa(MedusaConfig(num_heads=2), target)
    hidden = torch.randn(5, target.hidden_size)
    logits = heads(hidden)
    assert logits.shape == (2, 5, target.lm_head.weight.shape[0])
    # W = 0: each block adds SiLU(b), the same shift for every state
    shifted = [hidden + torch.nn.functional.silu(b.layers[0].bias) for b in heads.blocks]
    for k in range(2):
        torch.testing.assert_close(logits[k], target.lm_head(shifted[k]))
    listed = heads([hidden[:2], hidden[2:]])  # each head's states before its projection
    torch.testing.assert_close(heads.project(1, listed[1]), logits[1, 2:])


def test_save_load_and_its_refusals(target, tmp_path):
    heads = build_medusa(MedusaConfig(num_heads=2), target)
    folder = _saved(heads, target, tmp_path / "heads")
    loaded = load_medusa(folder, target)
    for name, tensor in heads.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    other = TargetAdapter(tiny_causal_lm("llama", vocab_size=128))
    with pytest.raises(FingerprintMismatchError):
        load_medusa(folder, other)
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    fields = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**fields, "medusa_num_heads": 3}))
    with pytest.raises(DrafterError, match="missing"):
        load_medusa(broken, target)


def _vllm_parameters(config: dict) -> dict[str, tuple[int, ...]]:
    """vLLM's `Medusa` module's parameters, as its code builds them (model_executor/models/
    medusa.py: ResidualBlock layers with bias=config.medusa_fc_bias, one ParallelLMHead per
    head over truncated_vocab_size rows), and `token_map` [truncated], which its load_weights
    takes by name when truncated_vocab_size < vocab_size."""
    h, v = config["hidden_size"], config["truncated_vocab_size"]
    params = {"token_map": (v,)} if v < config["vocab_size"] else {}
    for head in range(config["num_heads"]):
        for layer in range(config["num_hidden_layers"]):
            params[f"blocks.{head}.layers.{layer}.weight"] = (h, h)
            if config.get("medusa_fc_bias", False):
                params[f"blocks.{head}.layers.{layer}.bias"] = (h,)
        params[f"lm_heads.{head}.weight"] = (v, h)
    return params


def test_vllm_export_matches_vllms_parameters_and_config_parsing(target, tmp_path):
    heads = build_medusa(MedusaConfig(num_heads=3, num_layers=2), target)
    folder = _saved(heads, target, tmp_path / "heads")
    out = export_drafter(folder, tmp_path / "vllm", "vllm", target.config)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["MedusaModel"] and config["model_type"] == "medusa"
    # vLLM renames any key holding "num" and "heads" / "layers": nothing else may hold "num"
    assert sorted(k for k in config if "num" in k) == ["num_heads", "num_hidden_layers"]
    assert (config["num_heads"], config["num_hidden_layers"]) == (3, 2)
    from safetensors.torch import load_file

    weights = load_file(str(out / "model.safetensors"))
    expected = _vllm_parameters(config)
    assert {k: tuple(v.shape) for k, v in weights.items()} == expected
    for name, tensor in heads.state_dict().items():
        assert torch.equal(weights[name], tensor), name
    with pytest.raises(ExportError, match="exports to: vllm"):
        export_drafter(folder, tmp_path / "sg", "sglang")
    wider = tiny_causal_lm("llama").config
    wider.hidden_size = 64
    with pytest.raises(ExportError, match="hidden size"):
        export_drafter(folder, tmp_path / "bad", "vllm", wider)


def _reference_parameters(num_heads: int, h: int, v: int) -> dict[str, tuple[int, ...]]:
    """The Medusa reference model's head parameters, as its code builds them: head i is
    `nn.Sequential(ResBlock(h), nn.Linear(h, v, bias=False))` with `ResBlock.linear =
    nn.Linear(h, h)` (one layer), saved as `medusa_head.state_dict()`."""
    params = {}
    for head in range(num_heads):
        params[f"{head}.0.linear.weight"] = (h, h)
        params[f"{head}.0.linear.bias"] = (h,)
        params[f"{head}.1.weight"] = (v, h)
    return params


def test_medusa_reference_export_matches_its_parameters_and_config(target, tmp_path):
    from safetensors.torch import load_file

    heads = build_medusa(MedusaConfig(num_heads=3, num_layers=1), target)
    with torch.no_grad():
        for block in heads.blocks:
            block.layers[0].weight.normal_()
    folder = _saved(heads, target, tmp_path / "heads")
    out = export_drafter(folder, tmp_path / "ref", "medusa", target.config, verifier="base/x")
    config = json.loads((out / "config.json").read_text())
    assert config["medusa_num_heads"] == 3 and config["medusa_num_layers"] == 1
    assert config["base_model_name_or_path"] == "base/x"
    weights = load_file(str(out / "medusa_lm_head.safetensors"))
    h, v = target.hidden_size, target.lm_head.weight.shape[0]
    assert {k: tuple(t.shape) for k, t in weights.items()} == _reference_parameters(3, h, v)
    state = heads.state_dict()
    for head in range(3):
        assert torch.equal(
            weights[f"{head}.0.linear.weight"], state[f"blocks.{head}.layers.0.weight"]
        )
        assert torch.equal(weights[f"{head}.1.weight"], state[f"lm_heads.{head}.weight"])
    deeper = _saved(
        build_medusa(MedusaConfig(num_heads=2, num_layers=2), target), target, tmp_path / "d"
    )
    with pytest.raises(ExportError, match="heads of 1 layer"):
        export_drafter(deeper, tmp_path / "ref2", "medusa", target.config)


def test_truncated_heads_cover_their_token_map_and_export_it_for_vllm(target, tmp_path):
    vocab = target.lm_head.weight.shape[0]
    token_map = torch.tensor([3, 5, 8, 13, 21, 34, 55, 89])
    heads = build_medusa(MedusaConfig(num_heads=2, draft_vocab_size=8), target, token_map=token_map)
    assert heads.fields["truncated_vocab_size"] == 8 and heads.lm_heads[0].weight.shape[0] == 8
    hidden = torch.randn(4, target.hidden_size)
    logits = heads(hidden)  # [2, 4, V]: the target's vocabulary, -inf off the map
    assert logits.shape == (2, 4, vocab)
    off = torch.ones(vocab, dtype=torch.bool)
    off[token_map] = False
    assert torch.isinf(logits[..., off]).all() and torch.isfinite(logits[..., token_map]).all()
    shifted = hidden + torch.nn.functional.silu(heads.blocks[0].layers[0].bias)
    torch.testing.assert_close(logits[0][:, token_map], target.lm_head(shifted)[:, token_map])
    draft_ids = heads.draft_ids()
    assert draft_ids[token_map].tolist() == list(range(8)) and int(draft_ids[off].max()) == -1
    folder = _saved(heads, target, tmp_path / "heads")
    assert torch.equal(load_medusa(folder, target).token_map, token_map)
    out = export_drafter(folder, tmp_path / "vllm", "vllm", target.config)
    config = json.loads((out / "config.json").read_text())
    assert (config["vocab_size"], config["truncated_vocab_size"]) == (vocab, 8)
    from safetensors.torch import load_file

    weights = load_file(str(out / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in weights.items()} == _vllm_parameters(config)
    assert torch.equal(weights["token_map"], token_map)
    with pytest.raises(ExportError, match="no token map"):
        export_drafter(folder, tmp_path / "ref", "medusa", target.config, verifier="base/x")
    with pytest.raises(ValueError, match="ascending"):
        heads.set_token_map(token_map.flip(0))
    with pytest.raises(ValueError, match="larger than the target's vocabulary"):
        build_medusa(MedusaConfig(draft_vocab_size=vocab + 1), target)
    whole = build_medusa(MedusaConfig(draft_vocab_size=vocab), target)
    assert whole.token_map is None and "truncated_vocab_size" not in whole.fields
