"""MLA targets (DeepSeek-V3): their caches hold keys and values of different widths (the
compressed latent and the rotary part), each gathered on its own."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from draftzoo.inference.batch import BatchGenerator
from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.sampling import SamplingParams
from tests.inference.helpers import PROMPTS, TopKTreeProposer, perturbed_copy
from tests.tiny_architectures import tiny_model


@pytest.mark.parametrize("static", [False, True], ids=["growing", "static"])
def test_batched_trees_on_an_mla_target_equal_target_only(target_and_tokenizer, static):
    _, tokenizer = target_and_tokenizer
    model = tiny_model("deepseek_v3", len(tokenizer))
    cache = DynamicCache()
    model(input_ids=torch.tensor([[1, 2, 3]]), past_key_values=cache, use_cache=True)
    assert cache.layers[0].keys.shape[-1] != cache.layers[0].values.shape[-1]
    params = SamplingParams(max_new_tokens=24)
    plain = SpeculativeGenerator(model, tokenizer)
    reference = [plain.generate(prompt, params).token_ids for prompt in PROMPTS]
    noisy = perturbed_copy(model, 0.2)
    cache = CacheSettings(static=static, max_length=256)
    factory = lambda: TopKTreeProposer(noisy, width=2)  # noqa: E731
    batch = BatchGenerator(model, tokenizer, factory, 3, cache=cache)
    out = batch.generate(PROMPTS, params)
    assert [o.token_ids for o in out.outputs] == reference
    assert sum(o.metrics.num_accepted_tokens for o in out.outputs) > len(PROMPTS) * 4
