"""Native MTP modules: tiny synthetic checkpoints in the DeepSeek-V3, MiMo and Qwen3-Next layouts
(written from the transformers config classes), loaded into draftzoo's modules tensor by tensor,
the logits checked against a direct computation over the raw tensors, the vLLM export checked
key by key, and bad input refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftzoo.architectures.export import ExportError, export_drafter
from draftzoo.architectures.mtp import MtpConfig, build_mtp
from draftzoo.architectures.mtp_native import NativeMtpError, load_native_modules
from draftzoo.architectures.target import TargetAdapter

HIDDEN = 32


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0):
    x = x.float()
    return (offset + weight.float()) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _deepseek_config(layers: int):
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=64,
        hidden_size=HIDDEN,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )


def _write(folder: Path, config, tensors: dict) -> Path:
    folder.mkdir(parents=True)
    config.save_pretrained(folder)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    """(target folder, full 3-layer model): a 2-layer DeepSeek-V3 target whose checkpoint
    ships one MTP module at model.layers.2 — the 3-layer model's MoE layer 2 (saved by
    transformers in the per-expert checkpoint layout) plus the module's own tensors."""
    from transformers import DeepseekV3ForCausalLM

    root = tmp_path_factory.mktemp("deepseek")
    torch.manual_seed(0)
    full = DeepseekV3ForCausalLM(_deepseek_config(3)).eval()
    full.save_pretrained(root / "full")
    raw = load_file(root / "full" / "model.safetensors")
    assert "model.layers.2.mlp.experts.0.gate_proj.weight" in raw  # the checkpoint layout
    prefix = "model.layers.2."
    raw[prefix + "enorm.weight"] = 1 + 0.1 * torch.randn(HIDDEN)
    raw[prefix + "hnorm.weight"] = 1 + 0.1 * torch.randn(HIDDEN)
    raw[prefix + "eh_proj.weight"] = 0.1 * torch.randn(HIDDEN, 2 * HIDDEN)
    raw[prefix + "shared_head.norm.weight"] = 1 + 0.1 * torch.randn(HIDDEN)
    raw[prefix + "shared_head.head.weight"] = raw["lm_head.weight"].clone()
    raw[prefix + "embed_tokens.weight"] = raw["model.embed_tokens.weight"].clone()
    config = _deepseek_config(2)
    config.num_nextn_predict_layers = 1
    target = _write(root / "target", config, raw)
    return target, DeepseekV3ForCausalLM.from_pretrained(root / "full").eval()


def _adapter(folder: Path) -> TargetAdapter:
    from transformers import AutoModelForCausalLM

    return TargetAdapter(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval())


@torch.no_grad()
def test_deepseek_module_gives_the_logits_of_a_direct_computation(deepseek):
    folder, full = deepseek
    target = _adapter(folder)
    drafter = build_mtp(MtpConfig(depth=1, init_from="native"), target)
    assert load_native_modules(drafter, folder, target) == "deepseek_v3"
    assert type(drafter.layers[0].mtp_block.mlp).__name__ == "DeepseekV3MoE"
    raw = load_file(folder / "model.safetensors")
    p = "model.layers.2."
    ids = torch.randint(0, 64, (1, 10))
    n = ids.shape[1]
    with torch.no_grad():
        states = target.model(ids, output_hidden_states=True).hidden_states[-1]
    next_ids = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)  # x_{i+1}
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    positions = torch.arange(n)[None]
    mine = drafter.logits(drafter.module(0, next_ids, states, positions, causal))
    # direct: the raw tensors wired by hand; the block is transformers' own layer 2, loaded
    # from the same checkpoint tensors by transformers' own conversion
    embeds = raw[p + "embed_tokens.weight"][next_ids]
    x = torch.cat(
        [_rms(embeds, raw[p + "enorm.weight"]), _rms(states, raw[p + "hnorm.weight"])], -1
    )
    x = x @ raw[p + "eh_proj.weight"].T
    block = full.model.layers[2]
    block.self_attn.config._attn_implementation = "sdpa"
    rotary = full.model.rotary_emb(x, positions)
    out = block(x, attention_mask=causal, position_embeddings=rotary, position_ids=positions)
    direct = _rms(out, raw[p + "shared_head.norm.weight"]) @ raw[p + "shared_head.head.weight"].T
    torch.testing.assert_close(mine, direct, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("hand_over,fmt", [("residual", "vllm"), ("normed", "sglang")])
def test_deepseek_round_trip_exports_the_same_keys_and_tensors(deepseek, tmp_path, hand_over, fmt):
    """Either engine's format is the target's checkpoint with the module's tensors as the
    native checkpoint holds them (the formats differ in which convention they accept)."""
    from draftzoo.architectures.drafter_io import save_drafter

    folder, _ = deepseek
    target = _adapter(folder)
    drafter = build_mtp(MtpConfig(init_from="native", hand_over=hand_over), target)
    load_native_modules(drafter, folder, target)
    recipe = {"target": {"path": str(folder)}}
    save_drafter(drafter, tmp_path / "d", "mtp", target.fingerprint(), recipe, "none", [2])
    out = export_drafter(tmp_path / "d", tmp_path / fmt, fmt)
    raw = load_file(folder / "model.safetensors")
    native = {k: v for k, v in raw.items() if k.startswith("model.layers.2.")}
    exported = load_file(out / "model-mtp.safetensors")
    # vLLM's deepseek_mtp reads exactly these names (its own + the decoder layer's)
    assert set(exported) == set(native)
    for key, tensor in native.items():
        assert torch.equal(exported[key], tensor), key
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert {k for k, f in index.items() if f == "model-mtp.safetensors"} == set(native)
    rest = load_file(out / "model.safetensors")  # the target's shard, its old module removed
    assert not any(k.startswith("model.layers.2.") for k in rest)
    assert set(rest) | set(native) == set(raw)
    config = json.loads((out / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1
    assert config["draftzoo"] == {"family": "mtp", "mtp_hand_over": hand_over}


@torch.no_grad()
def test_two_modules_export_each_with_its_own_embedding_and_head(deepseek, tmp_path):
    """Every module carries the target's embedding and head in the engines' layout; the layout
    writer makes a copy per module (safetensors refuses tensors that share memory). Neither
    engine drafts with two modules as draftzoo does (vLLM runs the first at every step,
    SGLang loads one), so both formats refuse the drafter, writing nothing."""
    from draftzoo.architectures.drafter_io import read_drafter_weights, save_drafter
    from draftzoo.architectures.mtp_export import export_mtp

    folder, _ = deepseek
    target = _adapter(folder)
    drafter = build_mtp(MtpConfig(depth=2), target)
    recipe = {"target": {"path": str(folder)}}
    save_drafter(drafter, tmp_path / "d", "mtp", target.fingerprint(), recipe, "none", [2])
    for fmt, said in (("vllm", "vllm drafts with residual"), ("sglang", "serves one module")):
        with pytest.raises(ExportError, match=said):
            export_drafter(tmp_path / "d", tmp_path / fmt, fmt)
        assert not (tmp_path / fmt).exists()
    out = tmp_path / "layout"
    out.mkdir()
    export_mtp(tmp_path / "d", out, folder, read_drafter_weights(tmp_path / "d"))
    exported = load_file(out / "model-mtp.safetensors")
    raw = load_file(folder / "model.safetensors")
    for layer in (2, 3):
        prefix = f"model.layers.{layer}."
        assert torch.equal(
            exported[prefix + "embed_tokens.weight"], raw["model.embed_tokens.weight"]
        )
        assert torch.equal(exported[prefix + "shared_head.head.weight"], raw["lm_head.weight"])
    assert json.loads((out / "config.json").read_text())["num_nextn_predict_layers"] == 2


def test_native_bad_input_is_refused(deepseek, tmp_path, testbed_tiny):
    folder, _ = deepseek
    target = _adapter(folder)
    with pytest.raises(NativeMtpError, match="ships 1 MTP module"):
        load_native_modules(build_mtp(MtpConfig(depth=2), target), folder, target)
    # a hidden-size mismatch: the module of another model's width
    raw = load_file(folder / "model.safetensors")
    raw["model.layers.2.eh_proj.weight"] = torch.zeros(HIDDEN, 3 * HIDDEN)
    config = _deepseek_config(2)
    bad = _write(tmp_path / "bad", config, raw)
    with pytest.raises(NativeMtpError, match="hidden-size mismatch"):
        load_native_modules(build_mtp(MtpConfig(), target), bad, target)
    plain = _adapter(testbed_tiny[0])
    with pytest.raises(NativeMtpError, match="ships no MTP modules"):
        load_native_modules(build_mtp(MtpConfig(), plain), testbed_tiny[0], plain)


def _qwen2_config():
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=64,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )


@torch.no_grad()
def test_mimo_module_reads_hidden_first_and_loads_tensor_by_tensor(tmp_path):
    """MiMo (a Qwen2 target with model.mtp_layers.0.*): its input_proj reads cat(hidden,
    embedding); draftzoo's module gives the same logits as that wiring over the raw tensors."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    main = Qwen2ForCausalLM(_qwen2_config())
    layer = Qwen2ForCausalLM(_qwen2_config()).model.layers[0]
    raw = dict(main.state_dict())
    p = "model.mtp_layers.0."
    raw.update({p + k: v for k, v in layer.state_dict().items()})
    raw[p + "token_layernorm.weight"] = 1 + 0.1 * torch.randn(HIDDEN)
    raw[p + "hidden_layernorm.weight"] = 1 + 0.1 * torch.randn(HIDDEN)
    raw[p + "input_proj.weight"] = 0.1 * torch.randn(HIDDEN, 2 * HIDDEN)
    raw[p + "final_layernorm.weight"] = 1 + 0.1 * torch.randn(HIDDEN)
    config = _qwen2_config()
    config.num_nextn_predict_layers = 1
    folder = _write(tmp_path / "mimo", config, raw)
    target = _adapter(folder)
    drafter = build_mtp(MtpConfig(init_from="native"), target)
    assert load_native_modules(drafter, folder, target) == "mimo"
    mine_state = drafter.state_dict()
    for key, tensor in layer.state_dict().items():
        assert torch.equal(mine_state[f"layers.0.mtp_block.{key}"], tensor), key
    ids = torch.randint(0, 64, (1, 8))
    states = target.model(ids, output_hidden_states=True).hidden_states[-1]
    causal = torch.ones(8, 8, dtype=torch.bool).tril()[None, None]
    positions = torch.arange(8)[None]
    mine = drafter.logits(drafter.module(0, ids, states, positions, causal))
    hidden = _rms(states, raw[p + "hidden_layernorm.weight"])
    embeds = _rms(raw["model.embed_tokens.weight"][ids], raw[p + "token_layernorm.weight"])
    x = torch.cat([hidden, embeds], -1) @ raw[p + "input_proj.weight"].T
    layer.self_attn.config._attn_implementation = "sdpa"
    rotary = main.model.rotary_emb(x, positions)
    out = layer(x, attention_mask=causal, position_embeddings=rotary, position_ids=positions)
    direct = _rms(out, raw[p + "final_layernorm.weight"]) @ raw["lm_head.weight"].T
    torch.testing.assert_close(mine, direct, atol=1e-4, rtol=1e-4)


def test_qwen3_next_layout_maps_key_by_key():
    """Qwen3-Next's `mtp.*` names onto the module, tensor by tensor (module 0 only)."""
    from draftzoo.architectures.mtp_native import detect_layout, module_key

    keys = [
        "mtp.fc.weight",
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.pre_fc_norm_hidden.weight",
        "mtp.norm.weight",
        "mtp.layers.0.self_attn.q_proj.weight",
        "model.norm.weight",
    ]
    layout, prefixes = detect_layout(keys, 48)
    assert (layout, prefixes) == ("qwen3_next", ["mtp."])
    mapped = {k: module_key(layout, 0, k.removeprefix("mtp.")) for k in keys[:5]}
    assert mapped == {
        "mtp.fc.weight": "layers.0.eh_proj.weight",
        "mtp.pre_fc_norm_embedding.weight": "layers.0.enorm.weight",
        "mtp.pre_fc_norm_hidden.weight": "layers.0.hnorm.weight",
        "mtp.norm.weight": "layers.0.post_norm.weight",
        "mtp.layers.0.self_attn.q_proj.weight": "layers.0.mtp_block.self_attn.q_proj.weight",
    }
    with pytest.raises(NativeMtpError, match="one MTP module"):
        module_key(layout, 0, "layers.1.self_attn.q_proj.weight")


def test_export_refuses_targets_no_engine_serves_with_mtp(testbed_tiny, tmp_path):
    from draftzoo.architectures.drafter_io import save_drafter

    target = _adapter(testbed_tiny[0])
    drafter = build_mtp(MtpConfig(), target)
    recipe = {"target": {"path": str(testbed_tiny[0])}}
    save_drafter(drafter, tmp_path / "d", "mtp", target.fingerprint(), recipe, "none", [2])
    with pytest.raises(ExportError, match="only inside DeepSeek-style targets"):
        export_drafter(tmp_path / "d", tmp_path / "out", "vllm")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()
