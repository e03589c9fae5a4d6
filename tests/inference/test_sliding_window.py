"""Targets with sliding-window layers decode exactly on every cache, batched and in trees.

transformers applies no window to a prepared mask, so every runtime forward that passes one
(batches, trees, the static cache) windows it itself (`architectures/attention_masks.py`). The
tiny targets' window (8) is shorter than every sequence here, so a missed window changes the
output.
"""

from __future__ import annotations

import pytest

from draftzoo.architectures.attention_masks import attention_windows
from draftzoo.architectures.errors import TargetError
from draftzoo.inference.batch import BatchGenerator
from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.sampling import SamplingParams
from tests.inference.helpers import PROMPTS, TopKTreeProposer, perturbed_copy
from tests.tiny_architectures import WINDOW, tiny_model

#: every layer windowed (Mistral), windowed and full layers mixed (Gemma 2, gpt-oss)
KINDS = ["mistral", "gemma2", "gpt_oss"]
CACHES = {"growing": CacheSettings(), "static": CacheSettings(static=True, max_length=256)}


@pytest.fixture(scope="module", params=KINDS)
def windowed(request, target_and_tokenizer):
    """(model, tokenizer, target-only greedy ids of `PROMPTS`) of a tiny `kind` target."""
    _, tokenizer = target_and_tokenizer
    model = tiny_model(request.param, len(tokenizer))
    params = SamplingParams(max_new_tokens=24)
    plain = SpeculativeGenerator(model, tokenizer)
    reference = [plain.generate(prompt, params).token_ids for prompt in PROMPTS]
    return model, tokenizer, reference


def test_the_windows_are_read_from_the_config(windowed):
    model, _, _ = windowed
    windows = attention_windows(model.config)
    assert WINDOW in windows.values()
    if model.config.model_type != "mistral":
        assert windows == {"full_attention": None, "sliding_attention": WINDOW}


@pytest.mark.parametrize("cache", sorted(CACHES))
def test_target_only_batches_equal_one_row(windowed, cache):
    model, tokenizer, reference = windowed
    batch = BatchGenerator(model, tokenizer, None, 0, cache=CACHES[cache])
    out = batch.generate(PROMPTS, SamplingParams(max_new_tokens=24))
    assert [o.token_ids for o in out.outputs] == reference


@pytest.mark.parametrize("cache", sorted(CACHES))
def test_trees_on_one_row_and_four_equal_target_only(windowed, cache):
    """A top-2 tree from a perturbed copy of the target: drafts are accepted past the window,
    so a forward that attended outside it would change the text."""
    model, tokenizer, reference = windowed
    noisy = perturbed_copy(model, 0.2)
    params = SamplingParams(max_new_tokens=24)
    one = SpeculativeGenerator(
        model, tokenizer, TopKTreeProposer(noisy, width=2), 3, cache=CACHES[cache]
    )
    outs = [one.generate(prompt, params) for prompt in PROMPTS]
    assert [o.token_ids for o in outs] == reference
    assert sum(o.metrics.num_accepted_tokens for o in outs) > len(PROMPTS) * 4
    factory = lambda: TopKTreeProposer(noisy, width=2)  # noqa: E731
    batch = BatchGenerator(model, tokenizer, factory, 3, cache=CACHES[cache])
    assert [o.token_ids for o in batch.generate(PROMPTS, params).outputs] == reference


def test_a_multimodal_models_windows_are_its_text_decoders():
    from transformers import Gemma3Config

    text = {"num_hidden_layers": 2, "sliding_window": WINDOW}
    text["layer_types"] = ["sliding_attention", "full_attention"]
    windows = attention_windows(Gemma3Config(text_config=text))
    assert windows == {"full_attention": None, "sliding_attention": WINDOW}


def test_a_layer_type_no_mask_serves_is_refused(windowed):
    model, _, _ = windowed
    config = model.config.__class__.from_dict(model.config.to_dict())
    config.layer_types = ["chunked_attention"] * config.num_hidden_layers
    with pytest.raises(TargetError, match=r"\['chunked_attention'\] are not attention"):
        attention_windows(config)


def test_a_packed_batch_through_the_target_equals_each_sample_alone(windowed):
    """Packed training rows (Medusa-2's adapted target reads them) pass a prepared block mask:
    the adapter windows it, so each sample reads as it does alone."""
    import torch

    from draftzoo.architectures.target import TargetAdapter
    from draftzoo.data.batching import collate

    model, _, _ = windowed
    generator = torch.Generator().manual_seed(0)
    samples = [torch.randint(3, 1000, (n,), generator=generator).tolist() for n in (20, 15)]
    row = {
        "input_ids": samples[0] + samples[1],
        "loss_mask": [1] * 35,
        "lengths": [20, 15],
        "index": 0,
    }
    batch = collate([row], pad_token_id=0)
    adapter = TargetAdapter(model)
    layer = adapter.num_layers
    with torch.no_grad():
        packed = adapter(**batch.model_inputs(), hidden_indices=[layer]).hidden_states[layer]
        alone = [
            adapter(torch.tensor([s]), hidden_indices=[layer]).hidden_states[layer][0]
            for s in samples
        ]
    torch.testing.assert_close(packed[0], torch.cat(alone), rtol=1e-4, atol=1e-5)
