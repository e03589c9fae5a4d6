"""The preallocated-cache path (`StaticForward`): same outputs as the growing cache, on CPU.

CUDA graphs replay these same forwards on a GPU; here they run eagerly, which is the code the
graphs capture (the slots, positions and masks are computed the same way).
"""

import pytest
import torch

from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.generate import GenerationError, SpeculativeGenerator
from draftzoo.inference.proposers.draft_lm import DraftModelProposer
from draftzoo.inference.proposers.prompt_lookup import PromptLookupProposer
from draftzoo.inference.sampling import SamplingParams
from draftzoo.inference.static_forward import StaticForward
from tests.inference.helpers import TopKTreeProposer, assert_reads_per_round, perturbed_copy
from tests.inference.test_lossless_sampling import (
    _threshold,
    _tiny_lm,
    _tv,
    sample_outcomes,
    target_exact,  # noqa: F401 (fixture)
)
from tests.inference.test_runtime import PROMPTS


def _proposers(model, noisy):
    return {
        "target-only": None,
        "prompt-lookup": PromptLookupProposer(1, 3),
        "draft-lm-static": DraftModelProposer(
            noisy, cache=CacheSettings(static=True, max_length=256)
        ),
        "draft-lm-dynamic": DraftModelProposer(noisy),
        "tree-noisy": TopKTreeProposer(noisy, width=2),
    }


def test_greedy_output_and_tau_equal_the_growing_cache(target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    noisy = perturbed_copy(model, 0.5)
    params = SamplingParams(max_new_tokens=40)
    reference = [SpeculativeGenerator(model, tokenizer).generate(p, params) for p in PROMPTS]
    for name, proposer in _proposers(model, noisy).items():
        static = SpeculativeGenerator(
            model, tokenizer, proposer, 4, cache=CacheSettings(static=True, max_length=256)
        )
        dynamic = SpeculativeGenerator(model, tokenizer, proposer, 4)
        for prompt, expected in zip(PROMPTS, reference, strict=True):
            fast, slow = static.generate(prompt, params), dynamic.generate(prompt, params)
            assert fast.token_ids == expected.token_ids, name
            assert fast.metrics.num_target_forwards == slow.metrics.num_target_forwards, name
        if proposer is not None:
            assert fast.metrics.num_accepted_tokens > 0, name


@pytest.mark.parametrize("name", ["target-only", "draft-lm"])
def test_a_greedy_static_round_reads_the_host_once(target_and_tokenizer, name):
    """Greedy decoding on static caches reads the host once per round: the target's argmax,
    with a draft LM's chain (kept on the device since it was drafted) in the same read."""
    model, tokenizer = target_and_tokenizer
    noisy = perturbed_copy(model, 0.5)
    proposer = None
    if name == "draft-lm":
        proposer = DraftModelProposer(noisy, cache=CacheSettings(static=True, max_length=256))
    generator = SpeculativeGenerator(
        model, tokenizer, proposer, 4, cache=CacheSettings(static=True, max_length=256)
    )
    params = SamplingParams(max_new_tokens=40)
    plain = SpeculativeGenerator(model, tokenizer)
    reference = [plain.generate(prompt, params).token_ids for prompt in PROMPTS]
    assert_reads_per_round(generator, PROMPTS, reference, params)
    if proposer is not None:
        assert generator.generate(PROMPTS[0], params).metrics.num_accepted_tokens > 0


@torch.no_grad()
def test_committing_a_tree_branch_leaves_the_cache_of_that_sequence(target_and_tokenizer):
    model, _ = target_and_tokenizer
    runner = StaticForward(model, max_length=64)
    runner.reset(1)
    prefix = torch.tensor([[5, 17, 33, 8, 90]])
    runner.forward(prefix, None, None)
    runner.commit([list(range(5))])
    # root 41 with two branches: 7 -> 12 (nodes 0, 2) and 9 (node 1)
    tree = torch.tensor([[41, 7, 9, 12]])
    ancestors = torch.tensor(
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool
    )
    runner.forward(tree, torch.tensor([[0, 1, 1, 2]]), ancestors[None])
    runner.commit([[0, 1, 3]])  # root, 7, 12
    logits = runner.forward(torch.tensor([[60]]), None, None)[0, -1]
    full = model(input_ids=torch.tensor([[5, 17, 33, 8, 90, 41, 7, 12, 60]])).logits[0, -1]
    torch.testing.assert_close(logits, full, atol=1e-4, rtol=1e-4)
    # a chain rolled back by length alone: stale slots past it are never read
    runner.rollback([6])  # keep ... 90, 41
    logits = runner.forward(torch.tensor([[3]]), None, None)[0, -1]
    full = model(input_ids=torch.tensor([[5, 17, 33, 8, 90, 41, 3]])).logits[0, -1]
    torch.testing.assert_close(logits, full, atol=1e-4, rtol=1e-4)


def test_static_sampling_matches_the_target_distribution(target_exact):  # noqa: F811
    """The lossless-sampling test of `test_lossless_sampling.py`, with a confidently bad draft
    and both caches static (same threshold, false alarm < 1e-6)."""
    target, exact = target_exact
    bad = _tiny_lm(seed=7, sharpness=60.0)
    proposer = DraftModelProposer(bad, cache=CacheSettings(static=True, max_length=16))
    generator = SpeculativeGenerator(
        target, None, proposer, 2, cache=CacheSettings(static=True, max_length=16)
    )
    counts, accepted = sample_outcomes(generator)
    assert _tv(counts, exact) < _threshold(exact)
    assert accepted > 0


def test_static_cache_refuses_what_it_cannot_hold(target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    generator = SpeculativeGenerator(
        model, tokenizer, cache=CacheSettings(static=True, max_length=32)
    )
    with pytest.raises(GenerationError, match="do not fit the static cache's 32 positions"):
        generator.generate(list(range(1, 20)), SamplingParams(max_new_tokens=20))
    with pytest.raises(GenerationError, match="CUDA graphs need a model on CUDA"):
        StaticForward(model, 32, cuda_graphs=True)


def test_graph_buffers_give_the_same_tokens(target_and_tokenizer):
    """The path a CUDA graph captures (slots, positions and mask computed from the buffers'
    `length`, `depths` and `ancestors`), run eagerly on CPU: chains and trees of many widths."""
    model, tokenizer = target_and_tokenizer
    noisy = perturbed_copy(model, 0.5)
    params = SamplingParams(max_new_tokens=40)
    reference = [SpeculativeGenerator(model, tokenizer).generate(p, params) for p in PROMPTS]
    draft = DraftModelProposer(noisy, cache=CacheSettings(static=True, max_length=256))
    draft.forward.use_graphs = True
    for proposer in (draft, TopKTreeProposer(noisy, width=2)):
        generator = SpeculativeGenerator(
            model, tokenizer, proposer, 4, cache=CacheSettings(static=True, max_length=256)
        )
        generator.forward.use_graphs = True  # buffers without graphs off CUDA
        for prompt, expected in zip(PROMPTS, reference, strict=True):
            assert generator.generate(prompt, params).token_ids == expected.token_ids
        assert len(generator.forward._shapes) > 1
    assert draft.forward._shapes


def test_generate_command_and_load_take_the_static_cache(testbed_tiny, capsys):
    from draftzoo.cli import main

    base = ["generate", "--target", str(testbed_tiny[0]), "--prompt-lookup", "--prompt"]
    base += [PROMPTS[1], "--max-new-tokens", "24", "--num-speculative-tokens", "4"]
    assert main(base) == 0
    growing = capsys.readouterr().out
    assert main([*base, "--static-cache", "--device", "cpu"]) == 0
    static = capsys.readouterr().out
    text = lambda out: out.split("--- finish")[0]  # noqa: E731
    assert text(static) == text(growing) and "mean_acceptance_length:" in static
    assert main([*base, "--static-cache", "--max-cache-length", "16"]) == 2
    assert "static cache's 16 positions" in capsys.readouterr().err


def test_cache_settings_refuse_contradictions():
    with pytest.raises(GenerationError, match="cache length must be >= 1"):
        CacheSettings(static=True, max_length=0)
    with pytest.raises(GenerationError, match="set static too"):
        CacheSettings(cuda_graphs=True)


def test_a_tree_may_reach_past_the_last_position_it_can_commit(target_and_tokenizer):
    """A request that fills the cache exactly: near its end a tree's nodes run past
    `max_cache_length` (into the scratch slots), and only what fits is committed."""
    model, tokenizer = target_and_tokenizer
    prompt = list(range(5, 25))
    params = SamplingParams(max_new_tokens=12)
    expected = SpeculativeGenerator(model, tokenizer).generate(prompt, params).token_ids
    tree = TopKTreeProposer(perturbed_copy(model, 0.5), width=2)
    generator = SpeculativeGenerator(
        model, tokenizer, tree, 4, cache=CacheSettings(static=True, max_length=len(prompt) + 12)
    )
    assert generator.generate(prompt, params).token_ids == expected
