"""Shared fixtures: tiny models from configs and the testbed-tiny target, built once."""

from __future__ import annotations

import pytest
import torch


def tiny_causal_lm(kind: str, vocab_size: int = 96, layers: int = 3):
    """A tiny, seeded Llama, Mistral or Qwen3 causal LM built from a config."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    torch.manual_seed(0)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    if kind == "mistral":
        return MistralForCausalLM(MistralConfig(sliding_window=None, **common)).eval()
    if kind == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(head_dim=8, **common)).eval()
    raise ValueError(kind)


@pytest.fixture(scope="session")
def testbed_tiny(tmp_path_factory):
    """The testbed-tiny target, built by the real recipe (a few seconds)."""
    from draftzoo.train.testbed import build_testbed, load_testbed_config

    root = tmp_path_factory.mktemp("testbed")
    output = root / "testbed-tiny"
    record = build_testbed(load_testbed_config("tiny"), output, cache_dir=root / "cache")
    return output, record
