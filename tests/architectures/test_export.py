"""Exports hold exactly what each engine's loader maps: every key, shape and dtype, no leftover.

The expected parameter lists below are written from the engines' model definitions (vLLM's
`Eagle3LlamaForCausalLM` and `EagleLlamaForCausalLM`, SGLang's `LlamaForCausalLMEagle3`, the
speculators `Eagle3Speculator`), not from draftzoo's exporter: engines drop unknown names without
a word, so any extra or missing tensor must fail here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from draftzoo.architectures.drafter_io import read_drafter_record
from draftzoo.architectures.export import (
    ExportError,
    export_drafter,
    sglang_layer_ids,
    vllm_layer_ids,
)

FLOAT = (torch.float32, torch.bfloat16, torch.float16)


def engine_parameters(config: dict) -> dict[str, tuple[tuple[int, ...], tuple]]:
    """name -> (shape, allowed dtypes) the engine loads from an exported folder."""
    arch = config["architectures"][0]
    layer = config.get("transformer_layer_config", config)
    h, inter = layer["hidden_size"], layer["intermediate_size"]
    heads, kv, hd = layer["num_attention_heads"], layer["num_key_value_heads"], layer["head_dim"]
    eagle3 = arch in ("LlamaForCausalLMEagle3", "Eagle3Speculator")
    prefix = "midlayer." if arch == "LlamaForCausalLMEagle3" else "layers.0."
    attn_in = 2 * h if eagle3 else h
    spec = {
        f"{prefix}self_attn.q_proj.weight": ((heads * hd, attn_in), FLOAT),
        f"{prefix}self_attn.k_proj.weight": ((kv * hd, attn_in), FLOAT),
        f"{prefix}self_attn.v_proj.weight": ((kv * hd, attn_in), FLOAT),
        f"{prefix}self_attn.o_proj.weight": ((h, heads * hd), FLOAT),
        f"{prefix}post_attention_layernorm.weight": ((h,), FLOAT),
        f"{prefix}mlp.gate_proj.weight": ((inter, h), FLOAT),
        f"{prefix}mlp.up_proj.weight": ((inter, h), FLOAT),
        f"{prefix}mlp.down_proj.weight": ((h, inter), FLOAT),
    }
    if not eagle3:  # EAGLE-1: fc without bias, no input norm, the target's lm_head
        spec["fc.weight"] = ((h, 2 * h), FLOAT)
        return spec
    draft_vocab = config["draft_vocab_size"]
    if arch == "Eagle3Speculator" or config.get("draftzoo", {}).get("embed_tokens_from"):
        # speculators' save_pretrained writes the embedding; the engines load one if present
        spec["embed_tokens.weight"] = ((layer["vocab_size"], h), FLOAT)
    spec.update(
        {
            "fc.weight": ((h, 3 * config["target_hidden_size"]), FLOAT),
            f"{prefix}input_layernorm.weight": ((h,), FLOAT),
            f"{prefix}hidden_norm.weight": ((h,), FLOAT),
            "norm.weight": ((h,), FLOAT),
            "lm_head.weight": ((draft_vocab, h), FLOAT),
            "d2t": ((draft_vocab,), (torch.int64,)),
            "t2d": ((layer["vocab_size"],), (torch.bool,)),
        }
    )
    return spec


def read_export(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    config = json.loads((folder / "config.json").read_text())
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
    return config, tensors


def assert_matches_engine(config: dict, tensors: dict[str, torch.Tensor]) -> None:
    expected = engine_parameters(config)
    assert set(tensors) == set(expected), (
        f"leftover {sorted(set(tensors) - set(expected))}, "
        f"missing {sorted(set(expected) - set(tensors))}"
    )
    for name, (shape, dtypes) in expected.items():
        assert tuple(tensors[name].shape) == shape, name
        assert tensors[name].dtype in dtypes, (name, tensors[name].dtype)


@pytest.fixture(scope="module")
def shipped_eagle3():
    """(folder, target config) of the shipped EAGLE-3 drafter: it taps three distinct layers,
    which speculators requires (testbed-tiny's drafter taps layer 1 three times)."""
    from transformers import AutoConfig

    from draftzoo.architectures.zoo_index import ZooIndex, builtin_zoo_dir
    from draftzoo.train.testbed import committed_testbed_dir

    folder = ZooIndex(builtin_zoo_dir()).folder("eagle3-testbed-small")
    return folder, AutoConfig.from_pretrained(committed_testbed_dir())


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "speculators"])
def test_eagle3_exports_match_the_engine_loaders(
    tiny_drafters, tiny_target_model, shipped_eagle3, tmp_path, fmt
):
    if fmt == "speculators":
        folder, target_config = shipped_eagle3
    else:
        folder, target_config = tiny_drafters["eagle3"], tiny_target_model[0].config
    out = export_drafter(folder, tmp_path / fmt, fmt, target_config, verifier="my/target")
    config, tensors = read_export(out)
    assert_matches_engine(config, tensors)
    hf_layers = read_drafter_record(folder)["hidden_state_layers"]
    layer = config.get("transformer_layer_config", config)
    assert layer["max_position_embeddings"] == target_config.max_position_embeddings
    assert config["norm_before_residual"] is False  # written explicitly
    assert config["draft_vocab_size"] == tensors["lm_head.weight"].shape[0]
    assert config["target_hidden_size"] == target_config.hidden_size
    # the pruned vocabulary survives: d2t offsets map draft ids onto t2d's target ids
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    targets = torch.arange(len(d2t)) + d2t
    assert torch.equal(torch.nonzero(t2d, as_tuple=True)[0], targets.sort().values)
    if fmt == "vllm":
        assert config["architectures"] == ["LlamaForCausalLMEagle3"]
        assert config["eagle_aux_hidden_state_layer_ids"] == hf_layers  # input to layer k
        assert "eagle_config" not in config
    elif fmt == "sglang":
        assert config["architectures"] == ["LlamaForCausalLMEagle3"]
        ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        assert ids == [k - 1 for k in hf_layers]  # output of layer k - 1
        assert "eagle_aux_hidden_state_layer_ids" not in config
    else:
        assert config["architectures"] == ["Eagle3Speculator"]
        assert config["speculators_model_type"] == "eagle3"
        method = config["speculators_config"]["proposal_methods"][0]
        assert method["speculative_tokens"] == 3
        assert config["speculators_config"]["verifier"]["name_or_path"] == "my/target"
        assert config["eagle_aux_hidden_state_layer_ids"] == hf_layers
        assert not (config["norm_before_fc"] or config["fc_norm"] or config["norm_output"])


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_the_embedding_is_the_targets_where_asked(tiny_drafters, tiny_target_model, tmp_path, fmt):
    """Off by default for the engines (they share the target's), on with embed_tokens=True;
    the tensor is the target's own, bit for bit and in its dtype."""
    folder = tiny_drafters["eagle3"]
    _, plain = read_export(export_drafter(folder, tmp_path / "plain", fmt))
    assert "embed_tokens.weight" not in plain
    config, tensors = read_export(export_drafter(folder, tmp_path / "with", fmt, embed_tokens=True))
    assert_matches_engine(config, tensors)
    target_embedding = tiny_target_model[0].get_input_embeddings().weight
    assert torch.equal(tensors["embed_tokens.weight"], target_embedding)
    assert config["draftzoo"]["embed_tokens_from"] == str(Path(tiny_target_model[2]).resolve())


def test_speculators_export_records_a_verifier_found_from_anywhere(shipped_eagle3, tmp_path):
    from draftzoo.train.testbed import committed_testbed_dir

    config, tensors = read_export(export_drafter(shipped_eagle3[0], tmp_path / "s", "speculators"))
    verifier = config["speculators_config"]["verifier"]["name_or_path"]
    assert Path(verifier).is_absolute() and Path(verifier) == committed_testbed_dir().resolve()
    assert "embed_tokens.weight" in tensors  # speculators' own save_pretrained writes it


def test_speculators_export_refuses_repeated_layers(tiny_drafters, tmp_path):
    """speculators resolves distinct layer ids only: a drafter tapping one layer three times is
    refused here rather than by the peer's loader."""
    with pytest.raises(ExportError, match="distinct hidden-state layer ids"):
        export_drafter(tiny_drafters["eagle3"], tmp_path / "s", "speculators")
    assert not (tmp_path / "s").exists()


def test_exported_weights_equal_the_drafters(shipped_eagle3, tmp_path):
    folder = shipped_eagle3[0]
    _, original = read_export(folder)
    _, exported = read_export(export_drafter(folder, tmp_path / "s", "speculators"))
    for name, tensor in original.items():
        assert torch.equal(exported[name.replace("midlayer.", "layers.0.")], tensor), name


def test_eagle1_export_for_vllm_and_the_bias_it_cannot_load(tiny_drafters, tmp_path):
    config, tensors = read_export(export_drafter(tiny_drafters["eagle1"], tmp_path / "v", "vllm"))
    assert config["architectures"] == ["EagleLlamaForCausalLM"]
    assert_matches_engine(config, tensors)

    biased = tmp_path / "biased"
    biased.mkdir()
    for file in tiny_drafters["eagle1"].iterdir():
        (biased / file.name).write_bytes(file.read_bytes())
    from safetensors.torch import save_file

    _, weights = read_export(biased)
    weights["fc.bias"] = torch.zeros(weights["fc.weight"].shape[0])
    save_file(weights, str(biased / "model.safetensors"))
    with pytest.raises(ExportError, match="bias on fc"):
        export_drafter(biased, tmp_path / "b", "vllm")


def test_export_refuses_other_formats_and_another_context(
    tiny_drafters, tiny_target_model, tmp_path
):
    with pytest.raises(ExportError, match="eagle1 drafter exports to: vllm"):
        export_drafter(tiny_drafters["eagle1"], tmp_path / "x", "sglang")
    with pytest.raises(ExportError, match="draft_lm drafter exports to: hf"):
        export_drafter(tiny_drafters["draft_lm"], tmp_path / "y", "vllm")
    config = tiny_target_model[0].config.__class__.from_dict(tiny_target_model[0].config.to_dict())
    config.max_position_embeddings *= 2
    with pytest.raises(ExportError, match="max_position_embeddings"):
        export_drafter(tiny_drafters["eagle3"], tmp_path / "z", "vllm", config)
    assert not (tmp_path / "z").exists()


def test_draft_lm_exports_as_a_plain_transformers_checkpoint(
    tiny_drafters, tiny_target_model, tmp_path
):
    from transformers import AutoModelForCausalLM

    out = export_drafter(tiny_drafters["draft_lm"], tmp_path / "hf", "hf")
    assert not (out / "draftzoo.json").exists()
    draft = AutoModelForCausalLM.from_pretrained(out)
    target, tokenizer, _ = tiny_target_model
    ids = tokenizer("def add(a, b):", return_tensors="pt").input_ids
    plain = target.generate(ids, max_new_tokens=24, do_sample=False)
    assisted = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=draft)
    assert torch.equal(plain, assisted)


def test_layer_id_conventions():
    # draftzoo/HF index k = input to decoder layer k (vLLM's convention too)
    assert vllm_layer_ids([2, 16, 29], 32) == [2, 16, 29]
    # SGLang/SpecForge count the output of layer k - 1
    assert sglang_layer_ids([2, 16, 29], 32) == [1, 15, 28]
    with pytest.raises(ExportError, match="HF index 0"):
        sglang_layer_ids([0, 16, 29], 32)
    with pytest.raises(ExportError, match="final norm output"):
        vllm_layer_ids([2, 16, 32], 32)
