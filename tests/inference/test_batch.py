"""Batched generation: per-row acceptance with ragged rows equals batch-1 target-only output,
on the growing cache and on the static one (eagerly, and on the buffers CUDA graphs capture)."""

from __future__ import annotations

import pytest

from draftzoo.inference.batch import BatchGenerator
from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.generate import GenerationError
from draftzoo.inference.proposers.draft_lm import DraftModelProposer
from draftzoo.inference.proposers.prompt_lookup import PromptLookupProposer
from draftzoo.inference.sampling import SamplingParams
from tests.inference.helpers import PROMPTS, TopKTreeProposer, count_host_reads, perturbed_copy


def factories(model):
    noisy = perturbed_copy(model, 0.5)
    return {
        "target-only": None,
        "prompt-lookup": lambda: PromptLookupProposer(1, 3),
        "draft-lm-noisy": lambda: DraftModelProposer(noisy),
        "tree-noisy": lambda: TopKTreeProposer(noisy, width=2),
    }


def batch_generator(model, tokenizer, factory, gamma: int, cache: str, **kwargs):
    """A `BatchGenerator` on the `cache` named: "dynamic", "static", or "graph-buffers" (the
    static forward through the buffers a CUDA graph captures, run eagerly off CUDA)."""
    static = cache != "dynamic"
    batch = BatchGenerator(
        model,
        tokenizer,
        factory,
        gamma,
        cache=CacheSettings(static=static, max_length=256),
        **kwargs,
    )
    if cache == "graph-buffers":
        batch._forward(len(PROMPTS)).use_graphs = True
    return batch


CACHES = ["dynamic", "static", "graph-buffers"]


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("name", ["target-only", "prompt-lookup", "draft-lm-noisy", "tree-noisy"])
def test_batch_of_four_equals_batch_one_target_only(target_and_tokenizer, reference, name, cache):
    model, tokenizer = target_and_tokenizer
    batch = batch_generator(model, tokenizer, factories(model)[name], 3, cache)
    out = batch.generate(PROMPTS, SamplingParams(max_new_tokens=32))
    assert [o.token_ids for o in out.outputs] == reference
    if cache == "graph-buffers":  # one (rows, width) entry per shape, reused across rounds
        shapes = batch._static._shapes
        assert shapes and len(shapes) < out.num_rounds
    if name != "target-only":
        forwards = sum(o.metrics.num_target_forwards for o in out.outputs)
        tokens = sum(o.metrics.num_generated_tokens for o in out.outputs)
        assert tokens / forwards > 1.0  # rows really accepted drafts
        assert out.num_rounds < max(len(r) for r in reference) + 1


def test_above_the_threshold_rounds_fall_back_to_plain_decoding(target_and_tokenizer, reference):
    model, tokenizer = target_and_tokenizer
    batch = BatchGenerator(
        model, tokenizer, lambda: PromptLookupProposer(1, 3), max_speculative_batch=2
    )
    out = batch.generate(PROMPTS, SamplingParams(max_new_tokens=32))
    assert [o.token_ids for o in out.outputs] == reference
    # while more than 2 rows were unfinished nothing was proposed; later rounds speculated
    assert out.num_rounds >= min(len(r) for r in reference)
    never = BatchGenerator(
        model, tokenizer, lambda: PromptLookupProposer(1, 3), max_speculative_batch=0
    ).generate(PROMPTS, SamplingParams(max_new_tokens=32))
    assert sum(o.metrics.num_draft_tokens for o in never.outputs) == 0
    assert [o.token_ids for o in never.outputs] == reference


def test_batch_rows_stop_independently_and_bad_input_is_refused(target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    batch = BatchGenerator(model, tokenizer, lambda: PromptLookupProposer(1, 3))
    out = batch.generate(PROMPTS[:2], SamplingParams(max_new_tokens=5, stop_strings=("\n",)))
    assert all(o.finish_reason in ("stop_string", "length", "eos") for o in out.outputs)
    assert all(len(o.token_ids) <= 5 for o in out.outputs)
    with pytest.raises(GenerationError, match="empty"):
        batch.generate(["ok", ""])
    with pytest.raises(GenerationError, match="no prompts"):
        batch.generate([])


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_one_prompt_repeated_is_prefilled_once(target_and_tokenizer, reference, cache):
    """n samples of one prompt: one prefill row, its cache repeated; every row decodes as the
    prompt alone does (greedy), and each row samples on its own (seeded, rows differ)."""
    model, tokenizer = target_and_tokenizer
    batch = batch_generator(model, tokenizer, factories(model)["draft-lm-noisy"], 3, cache)
    widths = []
    hook = model.register_forward_hook(
        lambda m, args, kwargs, out: widths.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        out = batch.generate([PROMPTS[0]] * 3, SamplingParams(max_new_tokens=32))
    finally:
        hook.remove()
    assert widths[0][0] == 1 and all(shape[0] == 3 for shape in widths[1:2])
    assert [o.token_ids for o in out.outputs] == [reference[0]] * 3
    sampled = batch.generate([PROMPTS[0]] * 3, SamplingParams(temperature=1.0, seed=0))
    assert len({tuple(o.token_ids) for o in sampled.outputs}) > 1


def test_the_static_batch_refuses_what_it_cannot_hold_and_grows_with_the_batch(
    target_and_tokenizer, reference
):
    model, tokenizer = target_and_tokenizer
    batch = BatchGenerator(model, tokenizer, cache=CacheSettings(static=True, max_length=80))
    with pytest.raises(GenerationError, match="do not fit the static cache's 80 positions"):
        batch.generate([list(range(1, 20))], SamplingParams(max_new_tokens=70))
    first = batch.generate(PROMPTS[1:2], SamplingParams(max_new_tokens=32))
    assert [o.token_ids for o in first.outputs] == reference[1:2]
    small = batch._static
    assert small.max_rows == 1
    out = batch.generate(PROMPTS[1:4], SamplingParams(max_new_tokens=32))
    assert [o.token_ids for o in out.outputs] == reference[1:4]
    assert batch._static.max_rows == 3 and batch._static is not small
    bigger = batch._static
    batch.generate(PROMPTS[1:3], SamplingParams(max_new_tokens=4))  # fewer rows: same buffers
    assert batch._static is bigger


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_greedy_batched_round_reads_the_host_once(target_and_tokenizer, reference, cache):
    """Draft LMs on static caches keep their chains on the device; a greedy round reads every
    row's drafts and the target's argmax together, once (the prefill reads nothing)."""
    model, tokenizer = target_and_tokenizer
    noisy = perturbed_copy(model, 0.5)

    def factory():
        return DraftModelProposer(noisy, cache=CacheSettings(static=True, max_length=256))

    batch = batch_generator(model, tokenizer, factory, 3, cache)
    with count_host_reads() as reads:
        out = batch.generate(PROMPTS, SamplingParams(max_new_tokens=32))
    assert [o.token_ids for o in out.outputs] == reference
    assert sum(o.metrics.num_accepted_tokens for o in out.outputs) > 0
    assert reads[0] == out.num_rounds
