"""Shared fixtures: tiny models from configs and the testbed-tiny target, built once."""

from __future__ import annotations

import os
from pathlib import Path

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


@pytest.fixture(scope="session", autouse=True)
def timings_are_not_under_test():
    """The suite's evals time tiny models on whatever else the machine runs: their speedups are
    not evidence, so the unreliable-timing gate (draftzoo.eval.machine_load) is opened for
    them. The tests of the gate set its real bounds back (tests/eval/test_machine_load.py)."""
    from draftzoo.eval import machine_load

    names = ("MAX_OTHER_SHARE", "MAX_SPREAD", "MAX_DEVICE_OTHERS")
    bounds = {name: getattr(machine_load, name) for name in names}
    for name in names:
        setattr(machine_load, name, float("inf"))
    yield
    for name, bound in bounds.items():
        setattr(machine_load, name, bound)


@pytest.fixture(scope="session")
def testbed_tiny(tmp_path_factory):
    """The testbed-tiny target, built by the real recipe (a few seconds)."""
    from draftzoo.train.testbed import build_testbed, load_testbed_config

    root = tmp_path_factory.mktemp("testbed")
    output = root / "testbed-tiny"
    record = build_testbed(load_testbed_config("tiny"), output, cache_dir=root / "cache")
    return output, record


@pytest.fixture(scope="session")
def tiny_drafters(testbed_tiny, tmp_path_factory) -> dict[str, Path]:
    """{family: folder}: draft LM, EAGLE-1 and EAGLE-3 trained 6 steps on testbed-tiny."""
    from draftzoo.train.draft_lm import run as run_draft_lm
    from draftzoo.train.eagle import run as run_eagle
    from tests.train.helpers import tiny_eagle_recipe, tiny_recipe, write_chat_jsonl

    root = tmp_path_factory.mktemp("zoo-drafters")
    chat = write_chat_jsonl(root / "chat.jsonl", 24)
    steps = {"max_steps": 6, "warmup_steps": 1, "checkpoint_every": 100}
    out = {}
    recipe = tiny_recipe(root / "draft_lm", testbed_tiny[0], chat, train=steps)
    run_draft_lm(recipe)
    out["draft_lm"] = Path(recipe.output_dir)
    for kind in ("eagle1", "eagle3"):
        # EAGLE-3 taps the input of testbed-tiny's layer 1 three times: the only index every
        # engine can capture on a 2-layer target (SGLang counts outputs, so not 0; not N = 2)
        eagle = {"kind": kind, "layers": [1, 1, 1]} if kind == "eagle3" else {"kind": kind}
        recipe = tiny_eagle_recipe(root / kind, testbed_tiny[0], chat, eagle=eagle, train=steps)
        run_eagle(recipe)
        out[kind] = Path(recipe.output_dir)
    return out


@pytest.fixture(scope="module")
def tiny_target_model(testbed_tiny):
    """(model, tokenizer, folder) of testbed-tiny."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = testbed_tiny[0]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path), path


def pytest_terminal_summary(terminalreporter) -> None:
    """The robustness tallies (`tests/suite_counts.py`) after the results."""
    from tests.suite_counts import summary_lines

    for line in summary_lines():
        terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _pickle_permission_stays_in_its_test(monkeypatch):
    """`draftzoo --allow-pickle` sets DRAFTZOO_ALLOW_PICKLE for its process (and the workers it
    launches); in-process CLI tests would otherwise hand the permission to every later test."""
    from draftzoo.architectures.safe_load import ALLOW_PICKLE_ENV

    monkeypatch.setenv(ALLOW_PICKLE_ENV, os.environ.get(ALLOW_PICKLE_ENV, "0"))
