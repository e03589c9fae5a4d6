"""Fixtures of the runtime tests: the testbed-tiny target and tokenizer, loaded once a module."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def reference(target_and_tokenizer):
    """Target-only greedy token ids of `PROMPTS` (32 new tokens each)."""
    from draftzoo.inference.generate import SpeculativeGenerator
    from draftzoo.inference.sampling import SamplingParams
    from tests.inference.helpers import PROMPTS

    model, tokenizer = target_and_tokenizer
    params = SamplingParams(max_new_tokens=32)
    return [SpeculativeGenerator(model, tokenizer).generate(p, params).token_ids for p in PROMPTS]


@pytest.fixture(scope="module")
def target_and_tokenizer(testbed_tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = testbed_tiny[0]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)
