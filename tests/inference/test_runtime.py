import pytest
import torch

from draftzoo.inference.acceptance import accept, accept_greedy
from draftzoo.inference.generate import GenerationError, SpeculativeGenerator
from draftzoo.inference.proposer import ProposerError
from draftzoo.inference.proposers.draft_lm import DraftModelProposer
from draftzoo.inference.proposers.prompt_lookup import PromptLookupProposer
from draftzoo.inference.sampling import SamplingParams
from draftzoo.inference.tree import Proposal, tree_layout
from tests.inference.helpers import TopKTreeProposer, count_host_reads, perturbed_copy

PROMPTS = [
    'def add(a, b):\n    """Return a + b."""\n',
    "import os\n\n\nclass Loader:\n    def __init__(self, path):\n",
    "for i in range(10):\n    if i % 2 == 0:\n",
]


def test_tree_layout():
    tree = Proposal([5, 6, 7, 8], [-1, -1, 0, 2])
    assert tree.depths == [1, 1, 2, 3]
    assert tree.children[0] == [0, 1] and tree.children[1] == [2]
    assert tree.path_to(3) == [0, 2, 3]
    mask = tree.ancestor_mask()
    assert mask[4].tolist() == [True, True, False, True, True]  # node 3: root, 0, 2, itself
    assert mask[2].tolist() == [True, False, True, False, False]  # node 1: root, itself
    assert Proposal.chain([1, 2, 3]).is_chain and not tree.is_chain


def test_greedy_acceptance_against_a_hand_worked_tree():
    tree = Proposal([5, 6, 7, 8], [-1, -1, 0, 2])
    # target argmax per slot: root->5, node0->7, node1->9, node2->1, node3->4
    assert accept_greedy([5, 7, 9, 1, 4], tree) == ([0, 2], 1)  # 5, 7 accepted; 1 corrects
    assert accept_greedy([6, 7, 9, 1, 4], tree) == ([1], 9)
    assert accept_greedy([5, 7, 9, 8, 4], tree) == ([0, 2, 3], 4)  # full path + bonus
    assert accept_greedy([3, 7, 9, 8, 4], tree) == ([], 3)


def _random_tree(generator: torch.Generator, n: int) -> tuple[list[int], list[int]]:
    """Tokens and parents of a random tree whose siblings hold distinct tokens."""
    parents, tokens = [], []
    for i in range(n):
        parent = int(torch.randint(-1, i, (), generator=generator))
        taken = {tokens[c] for c in range(i) if parents[c] == parent}
        token = next(t for t in torch.randperm(6, generator=generator).tolist() if t not in taken)
        parents.append(parent)
        tokens.append(token)
    return tokens, parents


def test_a_tree_on_the_device_is_laid_out_and_accepted_as_on_the_host():
    """`tree_layout` computes `ancestor_mask` and the depths from device parents; greedy
    acceptance of the device tree (one read) equals the host walk, on random trees and
    answers (nothing accepted, part of a path, a whole path)."""
    generator = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(300):
        n = int(torch.randint(1, 9, (), generator=generator))
        tokens, parents = _random_tree(generator, n)
        host = Proposal(tokens, parents)
        depths, ancestors = tree_layout(torch.tensor(parents), max(host.depths))
        assert torch.equal(ancestors, host.ancestor_mask())
        assert depths.tolist() == [0, *host.depths]
        argmax = torch.randint(0, 6, (n + 1,), generator=generator)
        logits = torch.nn.functional.one_hot(argmax, 6).float()
        device = Proposal(torch.tensor(tokens), torch.tensor(parents), layout=(depths, ancestors))
        assert device.tree_on_device and len(device) == n
        with count_host_reads() as reads:
            answer = accept(logits, device, SamplingParams(), None)
        assert answer == accept_greedy(argmax.tolist(), host) and reads[0] == 1
        assert device.tokens == tokens and device.parents == parents and not device.unread
        seen.add(len(answer[0]))
    assert {0, 1, 2} <= seen


def _proposers(model, tokenizer):
    return {
        "target-only": None,
        "prompt-lookup": PromptLookupProposer(min_ngram=1, max_ngram=3),
        "draft-lm-self": DraftModelProposer(model, tokenizer, tokenizer),
        "draft-lm-noisy": DraftModelProposer(perturbed_copy(model, 0.5)),
        "tree-noisy": TopKTreeProposer(perturbed_copy(model, 0.5), width=2),
    }


def test_greedy_speculative_output_equals_target_only(target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    params = SamplingParams(max_new_tokens=40)
    outputs, taus = {}, {}
    for name, proposer in _proposers(model, tokenizer).items():
        generator = SpeculativeGenerator(model, tokenizer, proposer, num_speculative_tokens=4)
        results = [generator.generate(p, params) for p in PROMPTS]
        outputs[name] = [r.token_ids for r in results]
        forwards = sum(r.metrics.num_target_forwards for r in results)
        taus[name] = sum(len(r.token_ids) for r in results) / forwards
    for name, tokens in outputs.items():
        assert tokens == outputs["target-only"], name
    assert taus["target-only"] == 1.0
    assert taus["draft-lm-self"] > 4.0  # the target drafting for itself: all 4 + bonus
    assert 1.0 < taus["draft-lm-noisy"] < taus["draft-lm-self"]
    assert taus["tree-noisy"] > 1.0


def test_metrics_count_rounds(target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    generator = SpeculativeGenerator(model, tokenizer, DraftModelProposer(model), 3)
    out = generator.generate(PROMPTS[0], SamplingParams(max_new_tokens=17))
    m = out.metrics
    assert len(out.token_ids) == 17 and out.finish_reason == "length"
    assert m.num_generated_tokens == 17
    assert m.num_draft_tokens == 3 * m.num_drafts
    assert m.num_accepted_tokens + m.num_target_forwards == 17
    # rounds commit 4 tokens each (3 drafts + bonus) up to 16; the 17th comes undrafted
    assert m.num_drafts == 4 and m.num_target_forwards == 5
    assert m.acceptance_per_position == [1.0, 1.0, 1.0]
    assert m.mean_acceptance_length == 17 / m.num_target_forwards


def test_prompt_lookup_copies_the_continuation_of_the_last_match():
    proposer = PromptLookupProposer(min_ngram=1, max_ngram=2)
    params = SamplingParams()
    assert proposer.propose([1, 2, 3, 4, 9, 1, 2], 2, params, None).tokens == [3, 4]
    assert proposer.propose([7, 8, 9], 3, params, None).tokens == []
    # the most recent match wins
    assert proposer.propose([1, 5, 1, 6, 1], 1, params, None).tokens == [6]


def test_bad_requests_are_clear_errors(target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    generator = SpeculativeGenerator(model, tokenizer)
    with pytest.raises(GenerationError, match="the prompt is empty"):
        generator.generate("")
    with pytest.raises(GenerationError, match="leaves no room to generate"):
        generator.generate(list(range(10)) * 60)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        SamplingParams(temperature=-0.5)


def test_draft_lm_with_another_vocabulary_is_refused(target_and_tokenizer):
    from transformers import AutoTokenizer

    model, tokenizer = target_and_tokenizer
    other = AutoTokenizer.from_pretrained(target_and_tokenizer[1].name_or_path)
    other.add_tokens(["<extra_token>"])
    with pytest.raises(ProposerError, match=r"vocabulary .* differs from the target's"):
        DraftModelProposer(model, other, tokenizer)


def test_adaptive_length_follows_acceptance_and_cost():
    from draftzoo.inference.speculation_length import AdaptiveLength, best_gamma

    # the seed table: high acceptance and a cheap drafter draft long; a costly or weak one short
    assert best_gamma(alpha=0.9, cost_ratio=0.05, max_gamma=8) >= 6
    assert best_gamma(alpha=0.9, cost_ratio=0.0, max_gamma=8) == 8
    assert best_gamma(alpha=0.2, cost_ratio=0.5, max_gamma=8) == 0
    policy = AdaptiveLength(max_gamma=8, initial=4, warmup_rounds=2)
    assert policy.choose(room=10) == 4
    for _ in range(6):  # a drafter that is never right and costs half a target forward
        policy.observe(drafted=4, accepted=0, draft_seconds=0.02, verify_seconds=0.01)
    assert policy.choose(room=10) == 0
    for _ in range(8):
        policy.observe(drafted=0, accepted=0, draft_seconds=0.0, verify_seconds=0.01)
    assert policy.choose(room=10) == 1  # probes again
    policy.reset()
    for _ in range(20):  # always right, nearly free
        policy.observe(drafted=4, accepted=4, draft_seconds=0.0004, verify_seconds=0.01)
    assert policy.choose(room=10) == 8
    assert policy.choose(room=3) == 3


def test_adaptive_generation_stays_exact(target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    params = SamplingParams(max_new_tokens=30)
    reference = SpeculativeGenerator(model, tokenizer).generate(PROMPTS[1], params).token_ids
    adaptive = SpeculativeGenerator(model, tokenizer, PromptLookupProposer())
    assert adaptive.generate(PROMPTS[1], params).token_ids == reference
