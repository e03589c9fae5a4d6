"""Suffix decoding: the counting structure against brute force on random strings, eviction,
matching, the proposals it grows, greedy identity (chains, trees, batches), exact sampling with
trees of both one-hot branch kinds, the global cache across requests, bad input."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from draftzoo.inference.batch import BatchGenerator
from draftzoo.inference.errors import GenerationError
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.proposers.suffix import (
    SuffixCache,
    SuffixProposer,
    SuffixSettings,
    SuffixTrie,
    speculate,
)
from draftzoo.inference.sampling import SamplingParams
from tests.inference.helpers import PROMPTS
from tests.inference.test_lossless_sampling import (
    PARAMS,
    _exact_distribution,
    _threshold,
    _tiny_lm,
    _tv,
    sample_outcomes,
)


def _substring_counts(sequences, depth: int) -> Counter:
    counts = Counter()
    for seq in sequences:
        for i in range(len(seq)):
            for j in range(i + 1, min(len(seq), i + depth) + 1):
                counts[tuple(seq[i:j])] += 1
    return counts


def _all_nodes(trie: SuffixTrie) -> dict[tuple, int]:
    found, stack = {}, [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for token, child in node.children.items():
            found[(*path, token)] = child.count
            stack.append(((*path, token), child))
    return found


def _random_sequences(seed: int, count: int = 4, vocab: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(1, 30))] for _ in range(count)]


@pytest.mark.parametrize("seed", range(6))
def test_counts_equal_brute_force_and_removal_restores_them(seed):
    sequences, depth = _random_sequences(seed), 5
    trie = SuffixTrie(depth)
    for seq in sequences:
        suffixes = trie.open()
        cut = len(seq) // 2  # grown in two parts, as a request grows round by round
        suffixes = trie.extend(suffixes, seq[:cut])
        trie.extend(suffixes, seq[cut:])
    expected = _substring_counts(sequences, depth)
    assert _all_nodes(trie) == dict(expected)
    assert trie.nodes == len(expected) + 1
    trie.remove(sequences[0])
    trie.remove(sequences[2])
    rest = _substring_counts([sequences[1], sequences[3]], depth)
    assert _all_nodes(trie) == dict(rest) and trie.nodes == len(rest) + 1


@pytest.mark.parametrize("seed", range(6))
def test_match_is_the_longest_suffix_seen_with_a_continuation(seed):
    sequences, depth = _random_sequences(seed, vocab=2), 6
    trie = SuffixTrie(depth)
    for seq in sequences:
        trie.extend(trie.open(), seq)
    rng = random.Random(seed + 100)
    for _ in range(20):
        context = [rng.randrange(2) for _ in range(rng.randint(1, 10))]
        continued = {
            tuple(seq[i:j])
            for seq in sequences
            for i in range(len(seq))
            for j in range(i + 1, min(len(seq) - 1, i + depth) + 1)
        }
        want = max(
            (n for n in range(1, min(4, len(context)) + 1) if tuple(context[-n:]) in continued),
            default=0,
        )
        length, node = trie.match(context, 4)
        assert length == want and (node is None) == (want == 0)


def test_speculation_follows_counts_within_its_budget():
    trie = SuffixTrie(8)
    # after "1 2": "3" three times, "4" once; after "1 2 3": "5" twice, "6" once
    for seq in ([1, 2, 3, 5], [1, 2, 3, 5], [1, 2, 3, 6], [1, 2, 4]):
        trie.extend(trie.open(), seq)
    length, node = trie.match([9, 1, 2], 8)
    assert length == 2
    chain = speculate(node, length, SuffixSettings(min_token_prob=0.1, spec_factor=4), 8)
    assert chain.tokens == [3, 5] and chain.parents == [-1, 0]
    assert chain.score == pytest.approx(0.75 + 0.5)
    tree = speculate(node, length, SuffixSettings(tree=True, spec_factor=4, min_token_prob=0.2), 8)
    assert tree.tokens == [3, 5, 4, 6] and tree.parents == [-1, 0, -1, 0]
    short = speculate(node, length, SuffixSettings(spec_factor=0.5), 8)  # 0.5 x 2 = 1 token
    assert short.tokens == [3]
    assert speculate(node, length, SuffixSettings(min_token_prob=0.8), 8).tokens == []


def test_greedy_output_equals_target_only_chains_trees_and_batches(target_and_tokenizer, reference):
    model, tokenizer = target_and_tokenizer
    params = SamplingParams(max_new_tokens=32)
    for settings in (SuffixSettings(), SuffixSettings(tree=True, min_token_prob=0.05)):
        cache = SuffixCache(settings.depth)
        generator = SpeculativeGenerator(model, tokenizer, SuffixProposer(settings, cache), 8)
        outs = [generator.generate(p, params) for p in PROMPTS]
        assert [o.token_ids for o in outs] == reference
        assert sum(o.metrics.num_draft_tokens for o in outs) > 0
        batch = BatchGenerator(
            model, tokenizer, lambda s=settings, c=cache: SuffixProposer(s, c), 8
        )
        assert [o.token_ids for o in batch.generate(PROMPTS, params).outputs] == reference


def test_a_repeated_request_drafts_from_the_global_cache(target_and_tokenizer, reference):
    """The second time a prompt is asked, its first answer is in the global cache: fewer
    target forwards for the same tokens."""
    model, tokenizer = target_and_tokenizer
    params = SamplingParams(max_new_tokens=32)
    cache = SuffixCache()
    generator = SpeculativeGenerator(model, tokenizer, SuffixProposer(cache=cache), 8)
    first = generator.generate(PROMPTS[0], params)
    assert cache.tokens == len(first.token_ids) > 0
    second = generator.generate(PROMPTS[0], params)
    assert second.token_ids == first.token_ids == reference[0]
    assert second.metrics.num_target_forwards < first.metrics.num_target_forwards


def test_the_global_cache_evicts_the_oldest_outputs_past_its_budget():
    cache = SuffixCache(depth=4, max_tokens=10)
    for output in ([1, 2, 3, 4], [5, 6, 7], [8, 9, 1, 2]):
        cache.add(output)
    assert cache.tokens == 7 and list(cache.held) == [(5, 6, 7), (8, 9, 1, 2)]
    assert _all_nodes(cache.trie) == dict(_substring_counts([[5, 6, 7], [8, 9, 1, 2]], 4))


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_sampling_with_suffix_drafts_matches_the_target_distribution(tree):
    """Deterministic drafts (one-hot q), siblings included: the TV test of
    tests/inference/test_lossless_sampling.py."""
    target = _tiny_lm(seed=0, sharpness=30.0)
    exact = _exact_distribution(target, PARAMS)
    settings = SuffixSettings(depth=4, max_draft=2, tree=tree, min_token_prob=0.0, spec_factor=4)
    cache = SuffixCache(4)
    for output in ([1, 4, 2, 3, 0], [4, 2, 5, 1], [4, 3, 3, 2], [2, 2, 4, 1]):
        cache.add(output)
    proposer = SuffixProposer(settings, cache)
    generator = SpeculativeGenerator(target, None, proposer, num_speculative_tokens=3)
    counts, accepted = sample_outcomes(generator)
    tv, threshold = _tv(counts, exact), _threshold(exact)
    assert tv < threshold, f"TV {tv:.4f} >= {threshold:.4f}"
    assert accepted > 0


def test_bad_settings_are_refused_in_one_line(capsys):
    with pytest.raises(GenerationError, match="max_draft must be >= 1"):
        SuffixSettings(max_draft=0)
    with pytest.raises(GenerationError, match="depth must be >= 1"):
        SuffixSettings(depth=-3)
    with pytest.raises(GenerationError, match="counts substrings of 8"):
        SuffixProposer(SuffixSettings(depth=32), SuffixCache(depth=8))
    from draftzoo.cli import main

    code = main(["generate", "--suffix", "--suffix-max-draft", "0", "--prompt", "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["draftzoo: error: suffix max_draft must be >= 1, got 0"]


def test_each_measured_pass_starts_from_an_empty_global_cache():
    from draftzoo.inference.proposal_settings import from_name
    from draftzoo.inference.proposers.suffix_decoding import suffix_runtime

    runtime = suffix_runtime(SuffixSettings(), from_name("tree", 4))
    proposer = runtime.make_proposer()
    proposer.cache.add([1, 2, 3])
    assert runtime.make_proposer().cache is proposer.cache  # one cache for every request
    runtime.begin_pass()
    assert proposer.cache.tokens == 0 and proposer.cache.trie.nodes == 1
    assert runtime.tree.tree and runtime.tree.max_draft == 16


def test_eval_asks_for_a_drafter_or_one_model_free_proposer(capsys):
    from draftzoo.cli import main

    for args, said in (
        ([], "name a drafter, or --prompt-lookup or --suffix"),
        (["some-drafter", "--suffix"], "a drafter or a model-free proposer, not both"),
        (["--prompt-lookup", "--tree"], "--prompt-lookup drafts chains only (drop --tree)"),
    ):
        assert main(["eval", *args]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"draftzoo: error: draftzoo eval: {said}"
        ]
