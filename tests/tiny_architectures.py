"""Tiny random causal LMs of the architectures users bring, from transformers' own configs.

Each keeps what sets its architecture apart where drafters touch the target: sliding-window
layers (Mistral's every layer; Gemma 2/3 and gpt-oss mixed with full ones, a window of 8 so
every test sequence outgrows it), QKV bias and tied embeddings (Qwen2), q/k norms (Qwen3,
OLMo 2), experts (Qwen3-MoE, gpt-oss, DeepSeek-V3), attention sinks (gpt-oss), MLA
(DeepSeek-V3), soft-capped logits (Gemma 2), fused projections (Phi-3), scaled embeddings,
residuals and logits (Granite), post-norm layers (OLMo 2).
"""

from __future__ import annotations

from pathlib import Path

import torch

WINDOW = 8

#: model type: (config class name, what it sets beyond the common sizes)
ARCHITECTURES: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {"sliding_window": WINDOW}),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    ),
    "gemma2": (
        "Gemma2Config",
        {
            "head_dim": 16,
            "sliding_window": WINDOW,
            "final_logit_softcapping": 30.0,
            "attn_logit_softcapping": 50.0,
        },
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        {
            "head_dim": 16,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
        },
    ),
    "phi3": ("Phi3Config", {}),
    "gpt_oss": (
        "GptOssConfig",
        {
            "head_dim": 16,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": WINDOW,
            "rope_parameters": {"rope_type": "default", "rope_theta": 150000.0},
        },
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        {
            "num_key_value_heads": 4,  # MLA expands keys to every head, as DeepSeek-V3's own config
            "kv_lora_rank": 16,
            "q_lora_rank": None,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
            "moe_intermediate_size": 32,
        },
    ),
    "olmo2": ("Olmo2Config", {}),
    "granite": (
        "GraniteConfig",
        {
            "embedding_multiplier": 12.0,
            "logits_scaling": 8.0,
            "residual_multiplier": 0.22,
            "attention_multiplier": 0.0625,
        },
    ),
}


def tiny_config(kind: str, vocab_size: int, layers: int = 4, special_ids=(0, 1, 2)):
    """The config of a tiny `kind` model: hidden 64, 4 heads (2 KV), `layers` layers; pad,
    bos and eos ids inside the vocabulary."""
    import transformers

    class_name, own = ARCHITECTURES[kind]
    pad, bos, eos = special_ids
    sizes = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "pad_token_id": pad,
        "bos_token_id": bos,
        "eos_token_id": eos,
    }
    return getattr(transformers, class_name)(**{**sizes, **own})


def tiny_model(kind: str, vocab_size: int, layers: int = 4, seed: int = 0, special_ids=(0, 1, 2)):
    """A seeded tiny `kind` causal LM in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(kind, vocab_size, layers, special_ids)
    return AutoModelForCausalLM.from_config(config).eval()


def save_tiny_target(kind: str, folder: Path, tokenizer, layers: int = 4) -> Path:
    """A tiny `kind` target with `tokenizer`'s vocabulary and special ids, saved to `folder`
    as a model folder (weights, config, tokenizer) a recipe names."""
    special = (tokenizer.pad_token_id or 0, tokenizer.bos_token_id, tokenizer.eos_token_id)
    model = tiny_model(kind, len(tokenizer), layers, special_ids=special)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)
