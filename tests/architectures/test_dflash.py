"""DFlash's module and exports: the reference's taps, and exports holding exactly what z-lab's
`DFlashDraftModel` (the layout vLLM and SGLang load as `dflash`) and speculators'
`DFlashSpeculator` define, key by key, with their layer-id conventions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftzoo.architectures.dflash import reference_taps
from draftzoo.architectures.export import ExportError, export_drafter
from draftzoo.train.dflash import run
from tests.architectures.test_export import FLOAT, read_export
from tests.train.helpers import tiny_dflash_recipe, write_chat_jsonl


def dflash_parameters(config: dict) -> dict[str, tuple[tuple[int, ...], tuple]]:
    """name -> (shape, dtypes) of z-lab's `DFlashDraftModel` (speculators' `DFlashSpeculator`
    saves the same names; it fills the embedding and head from the verifier)."""
    layer = config.get("transformer_layer_config", config)
    h, inter = layer["hidden_size"], layer["intermediate_size"]
    heads, kv, hd = layer["num_attention_heads"], layer["num_key_value_heads"], layer["head_dim"]
    if "dflash_config" in config:
        taps = len(config["dflash_config"]["target_layer_ids"])
    else:
        taps = len(config["aux_hidden_state_layer_ids"])
    spec = {
        "fc.weight": ((h, taps * h), FLOAT),
        "hidden_norm.weight": ((h,), FLOAT),
        "norm.weight": ((h,), FLOAT),
    }
    for i in range(layer["num_hidden_layers"]):
        p = f"layers.{i}."
        spec.update(
            {
                f"{p}self_attn.q_proj.weight": ((heads * hd, h), FLOAT),
                f"{p}self_attn.k_proj.weight": ((kv * hd, h), FLOAT),
                f"{p}self_attn.v_proj.weight": ((kv * hd, h), FLOAT),
                f"{p}self_attn.o_proj.weight": ((h, heads * hd), FLOAT),
                f"{p}self_attn.q_norm.weight": ((hd,), FLOAT),
                f"{p}self_attn.k_norm.weight": ((hd,), FLOAT),
                f"{p}input_layernorm.weight": ((h,), FLOAT),
                f"{p}post_attention_layernorm.weight": ((h,), FLOAT),
                f"{p}mlp.gate_proj.weight": ((inter, h), FLOAT),
                f"{p}mlp.up_proj.weight": ((inter, h), FLOAT),
                f"{p}mlp.down_proj.weight": ((h, inter), FLOAT),
            }
        )
    return spec


@pytest.fixture(scope="module")
def drafter(testbed_tiny, tmp_path_factory) -> Path:
    """A two-layer DFlash drafter tapping HF index 1, trained 2 steps on testbed-tiny."""
    root = tmp_path_factory.mktemp("dflash")
    chat = write_chat_jsonl(root / "chat.jsonl", 16)
    recipe = tiny_dflash_recipe(
        root,
        testbed_tiny[0],
        chat,
        dflash={"layers": [1], "num_layers": 2},
        train={"max_steps": 2, "checkpoint_every": 10},
    )
    run(recipe)
    return Path(recipe.output_dir)


def test_reference_taps_are_layer_outputs_evenly_spaced():
    # z-lab's build_target_layer_ids, each id + 1 (they read hidden_states[id + 1])
    assert reference_taps(36, 5) == (2, 10, 18, 26, 34)
    assert reference_taps(32, 5) == (2, 9, 16, 23, 30)
    assert reference_taps(12, 1) == (7,)


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "speculators"])
def test_exports_hold_exactly_what_the_engines_define(drafter, tmp_path, fmt):
    out = export_drafter(drafter, tmp_path / fmt, fmt)
    config, tensors = read_export(out)
    expected = dflash_parameters(config)
    assert set(tensors) == set(expected)
    for name, (shape, dtypes) in expected.items():
        assert tuple(tensors[name].shape) == shape and tensors[name].dtype in dtypes, name
    ours = json.loads((drafter / "config.json").read_text())
    if fmt == "speculators":
        assert config["architectures"] == ["DFlashSpeculator"]
        assert config["aux_hidden_state_layer_ids"] == [1]  # HF indices
        assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
        assert config["draft_vocab_size"] == config["transformer_layer_config"]["vocab_size"]
    else:
        assert config["architectures"] == ["DFlashDraftModel"]
        assert config["dflash_config"]["target_layer_ids"] == [0]  # outputs of layers
        assert config["num_target_layers"] == 2 and config["num_hidden_layers"] == 2
        assert config["dflash_config"]["mask_token_id"] == 0
    assert config.get("block_size") == ours["block_size"] == 4
    from safetensors.torch import load_file

    own = load_file(drafter / "model.safetensors")
    assert all(torch.equal(own[k], tensors[k]) for k in own)


def test_exports_refuse_taps_the_engines_cannot_read_and_other_formats(
    testbed_tiny, drafter, tmp_path
):
    with pytest.raises(ExportError, match="a dflash drafter exports to: vllm, sglang, speculators"):
        export_drafter(drafter, tmp_path / "m", "medusa")
    chat = write_chat_jsonl(tmp_path / "chat.jsonl", 16)
    recipe = tiny_dflash_recipe(
        tmp_path, testbed_tiny[0], chat, dflash={"layers": [0]}, train={"max_steps": 2}
    )
    run(recipe)
    with pytest.raises(ExportError, match="HF index 0"):
        export_drafter(Path(recipe.output_dir), tmp_path / "s", "sglang")
    assert not (tmp_path / "s").exists()


def test_export_command_refuses_another_format_in_one_line(drafter, tmp_path, capsys):
    from draftzoo.cli import main

    code = main(["export", str(drafter), "--format", "medusa", "--output-dir", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("draftzoo: error: a dflash drafter exports to: vllm, sglang")
