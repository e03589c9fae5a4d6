"""Fixtures of the runtime tests: the testbed-tiny target and tokenizer, loaded once a module."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def target_and_tokenizer(testbed_tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = testbed_tiny[0]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)
