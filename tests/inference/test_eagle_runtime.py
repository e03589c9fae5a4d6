"""EAGLE proposers in the runtime: greedy identity (chain and EAGLE-2 tree, batch 1 and 4),
lossless sampling plumbing, and the drafter's state following the committed tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftzoo.inference.batch import BatchGenerator
from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.errors import GenerationError
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.proposers.eagle import EagleProposer, TreeSettings
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.eagle import run
from tests.inference.helpers import (
    PROMPTS,
    RecordingProposer,
    assert_reads_per_round,
    count_host_reads,
)
from tests.train.helpers import tiny_eagle_recipe, write_chat_jsonl


@pytest.fixture(scope="module")
def drafters(testbed_tiny, tmp_path_factory) -> dict[str, Path]:
    """EAGLE-1 and EAGLE-3 drafters trained briefly on testbed-tiny (real steps)."""
    root = tmp_path_factory.mktemp("eagle")
    chat = write_chat_jsonl(root / "chat.jsonl", 48)
    out = {}
    for kind in ("eagle1", "eagle3"):
        recipe = tiny_eagle_recipe(
            root / kind,
            testbed_tiny[0],
            chat,
            eagle={"kind": kind},
            train={"max_steps": 40, "lr": 5e-3, "warmup_steps": 2, "checkpoint_every": 100},
        )
        run(recipe)
        out[kind] = Path(recipe.output_dir)
    return out


CASES = {
    "eagle1-chain": ("eagle1", None),
    "eagle3-chain": ("eagle3", None),
    "eagle3-tree": ("eagle3", TreeSettings(top_k=4, depth=4, total_tokens=12)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_output_equals_target_only_batch_1_and_4(
    drafters, target_and_tokenizer, reference, case
):
    model, tokenizer = target_and_tokenizer
    kind, tree = CASES[case]
    proposer = EagleProposer.from_pretrained(drafters[kind], model, tokenizer, tree)
    single = SpeculativeGenerator(model, tokenizer, proposer, num_speculative_tokens=4)
    params = SamplingParams(max_new_tokens=32)
    outputs = [single.generate(p, params) for p in PROMPTS]
    assert [o.token_ids for o in outputs] == reference
    tokens = sum(o.metrics.num_generated_tokens for o in outputs)
    forwards = sum(o.metrics.num_target_forwards for o in outputs)
    assert tokens / forwards > 1.2, f"{case}: tau {tokens / forwards:.2f}"
    drafter = proposer.drafter
    batch = BatchGenerator(
        model, tokenizer, lambda: EagleProposer(drafter, tree), num_speculative_tokens=4
    )
    out = batch.generate(PROMPTS, params)
    assert [o.token_ids for o in out.outputs] == reference
    # the batched rows accept drafts as the single ones do (one row may accept none: a drafter
    # trained 40 steps can miss a whole prompt, so the batch may need as many rounds as tokens)
    batched_forwards = sum(o.metrics.num_target_forwards for o in out.outputs)
    assert tokens / batched_forwards > 1.2, f"{case} batched: tau {tokens / batched_forwards:.2f}"
    assert out.num_rounds <= max(len(r) for r in reference)
    # on the static batch cache through the graph buffers, with the target states hooked there
    static = BatchGenerator(
        model,
        tokenizer,
        lambda: EagleProposer(drafter, tree, cache=CacheSettings(static=True, max_length=256)),
        num_speculative_tokens=4,
        cache=CacheSettings(static=True, max_length=256),
    )
    static._forward(len(PROMPTS)).use_graphs = True
    with count_host_reads() as reads:
        again = static.generate(PROMPTS, params)
    assert reads[0] == again.num_rounds  # every row's drafts (and trees) with the answer
    assert [o.token_ids for o in again.outputs] == reference
    assert [o.metrics.num_target_forwards for o in again.outputs] == [
        o.metrics.num_target_forwards for o in out.outputs
    ]


STATIC_CASES = {
    "eagle1-chain": ("eagle1", None),
    "eagle3-chain": ("eagle3", None),
    "eagle1-tree": ("eagle1", TreeSettings(top_k=4, depth=4, total_tokens=12)),
    "eagle3-tree": ("eagle3", TreeSettings(top_k=4, depth=4, total_tokens=12)),
}


@pytest.mark.parametrize("case", sorted(STATIC_CASES))
def test_static_drafting_proposes_what_the_growing_cache_proposes(
    drafters, target_and_tokenizer, reference, case
):
    """Chains and greedy EAGLE-2 trees on the static drafter cache — eagerly, and on the graph
    buffers a CUDA graph captures (run eagerly off CUDA) — propose the growing cache's tokens
    and tree in every round."""
    model, tokenizer = target_and_tokenizer
    kind, tree = STATIC_CASES[case]
    drafter = EagleProposer.from_pretrained(drafters[kind], model, tokenizer).drafter
    params = SamplingParams(max_new_tokens=32)
    proposals, outputs = {}, {}
    for name in ("growing", "static", "graph-buffers"):
        static = name != "growing"
        inner = EagleProposer(drafter, tree, cache=CacheSettings(static=static, max_length=256))
        if name == "graph-buffers":
            inner.slots.use_graphs = True
        proposer = RecordingProposer(inner)
        generator = SpeculativeGenerator(
            model, tokenizer, proposer, 4, cache=CacheSettings(static=static, max_length=256)
        )
        outs = [generator.generate(p, params) for p in PROMPTS]
        outputs[name] = [(o.token_ids, o.metrics.num_target_forwards) for o in outs]
        proposals[name] = proposer.proposals
        assert [o.token_ids for o in outs] == reference, name
    assert outputs["static"] == outputs["growing"] == outputs["graph-buffers"]
    assert proposals["static"] == proposals["growing"] == proposals["graph-buffers"]
    assert sum(len(tokens) for tokens, _ in proposals["static"]) > 0
    graphs = inner.slots._chains if tree is None else inner.slots._trees
    assert inner.slots._feeds and graphs  # the graph-buffer path really ran


@pytest.mark.parametrize("case", sorted(STATIC_CASES))
def test_a_greedy_static_round_reads_the_host_once(drafters, target_and_tokenizer, reference, case):
    """Static target and drafter caches, greedy chains and trees: the draft tokens (and a
    tree's parents and layout) stay on the device, the verification input and mask are built
    there, and each round reads the drafts with the target's answer in one read (the prefill
    and the first catch-up read nothing)."""
    model, tokenizer = target_and_tokenizer
    kind, tree = STATIC_CASES[case]
    drafter = EagleProposer.from_pretrained(drafters[kind], model, tokenizer).drafter
    proposer = EagleProposer(drafter, tree, cache=CacheSettings(static=True, max_length=256))
    generator = SpeculativeGenerator(
        model, tokenizer, proposer, 4, cache=CacheSettings(static=True, max_length=256)
    )
    params = SamplingParams(max_new_tokens=32)
    assert_reads_per_round(generator, PROMPTS, reference, params)


def test_static_chain_refuses_what_it_cannot_hold(drafters, target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    drafter = EagleProposer.from_pretrained(drafters["eagle3"], model, tokenizer).drafter
    proposer = EagleProposer(drafter, cache=CacheSettings(static=True, max_length=256))
    generator = SpeculativeGenerator(model, tokenizer, proposer, 20)
    with pytest.raises(GenerationError, match="chains of 1 to 16 tokens, not 20"):
        generator.generate(PROMPTS[0], SamplingParams(max_new_tokens=24))
    proposer = EagleProposer(drafter, cache=CacheSettings(static=True, max_length=16))
    generator = SpeculativeGenerator(model, tokenizer, proposer, 4)
    with pytest.raises(GenerationError, match="static cache holds 16 positions"):
        generator.generate(list(range(5, 30)), SamplingParams(max_new_tokens=4))


def test_a_one_wide_tree_is_the_chain(drafters, target_and_tokenizer):
    """A tree expanding one node per depth, `depth` tokens in all, drafts exactly the chain:
    the same tokens in the same number of target forwards. (Wider trees against chains:
    tests/inference/test_committed_drafter.py, with a fully trained drafter.)"""
    model, tokenizer = target_and_tokenizer
    params = SamplingParams(max_new_tokens=32)
    runs = {}
    for name, tree in (("chain", None), ("tree", TreeSettings(top_k=1, depth=4, total_tokens=4))):
        proposer = EagleProposer.from_pretrained(drafters["eagle3"], model, tokenizer, tree)
        generator = SpeculativeGenerator(model, tokenizer, proposer, num_speculative_tokens=4)
        outs = [generator.generate(p, params) for p in PROMPTS]
        runs[name] = [(o.token_ids, o.metrics.num_target_forwards) for o in outs]
    assert runs["tree"] == runs["chain"]


def test_sampled_trees_hold_siblings_drawn_without_replacement(drafters, target_and_tokenizer):
    """T > 0: every node carries the q_i it was drawn from; siblings are distinct and each
    sibling's q_i is zero on the earlier siblings' tokens; the budget and depth hold."""
    model, tokenizer = target_and_tokenizer
    settings = TreeSettings(top_k=4, depth=4, total_tokens=25, sampled_children=3)
    proposer = EagleProposer.from_pretrained(drafters["eagle3"], model, tokenizer, settings)
    context = tokenizer(PROMPTS[1], add_special_tokens=False).input_ids
    from draftzoo.architectures.target import TargetAdapter
    from draftzoo.inference.generate import fused_states

    with TargetAdapter(model).capture(proposer.target_layers) as captured:
        model(input_ids=torch.tensor([context[:-1]]))
        proposer.observe(fused_states(captured, proposer.target_layers)[0])
    params = SamplingParams(temperature=1.0)
    proposal = proposer.propose(context, 4, params, params.generator())
    # 3 at the root; all 3 expanded (9 at depth 2); the best top_k = 4 of those 9 expanded
    # (12 at depth 3, 24 in all); the one token left goes to the best node of depth 3
    assert len(proposal) == 25 and max(proposal.depths) == 4
    per_depth = [proposal.depths.count(d) for d in (1, 2, 3, 4)]
    assert per_depth == [3, 9, 12, 1], per_depth
    assert proposal.draft_probs.shape == (len(proposal), model.config.vocab_size)
    for children in proposal.children:
        seen = []
        for child in children:
            q = proposal.draft_probs[child]
            assert q.sum().item() == pytest.approx(1.0, abs=1e-5)
            assert q[proposal.tokens[child]] > 0
            assert all(q[token] == 0 for token in seen)
            seen.append(proposal.tokens[child])
        assert len(children) <= 3


def test_sampling_runs_and_drafter_cache_holds_only_real_positions(drafters, target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    proposer = EagleProposer.from_pretrained(drafters["eagle3"], model, tokenizer)
    generator = SpeculativeGenerator(model, tokenizer, proposer, num_speculative_tokens=4)
    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=3)
    out = generator.generate(PROMPTS[0], params)
    prompt_len = len(tokenizer(PROMPTS[0], add_special_tokens=False).input_ids)
    assert out.metrics.num_draft_tokens > 0
    # after the last round the cache holds real entries only: one per committed position
    # that has a target state, i.e. all but the positions committed in the last round
    assert proposer.slots.length <= prompt_len + len(out.token_ids) - 1
    assert proposer.slots.length >= prompt_len - 1
    again = generator.generate(PROMPTS[0], params)
    assert again.token_ids == out.token_ids  # same seed, same output: no state leaks


def test_generate_command_drafts_eagle2_trees(drafters, testbed_tiny, capsys):
    from draftzoo.cli import main

    args = ["generate", "--target", str(testbed_tiny[0]), "--drafter", str(drafters["eagle3"])]
    args += ["--tree", "--tree-top-k", "4", "--tree-depth", "4", "--tree-tokens", "12"]
    args += ["--prompt", PROMPTS[0], "--max-new-tokens", "16", "--num-speculative-tokens", "4"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith(PROMPTS[0]) and "mean_acceptance_length:" in out
    assert main(["generate", "--target", str(testbed_tiny[0]), "--tree", "--prompt", "x"]) == 2
    assert "a tree proposal needs --drafter" in capsys.readouterr().err


def test_static_target_cache_keeps_eagle_outputs_and_tau(drafters, target_and_tokenizer, reference):
    """The target on a preallocated cache hands EAGLE the same states: same output, same tau."""
    model, tokenizer = target_and_tokenizer
    params = SamplingParams(max_new_tokens=32)
    for kind, tree in CASES.values():
        proposer = EagleProposer.from_pretrained(drafters[kind], model, tokenizer, tree)
        static = SpeculativeGenerator(
            model, tokenizer, proposer, 4, cache=CacheSettings(static=True)
        )
        dynamic = SpeculativeGenerator(model, tokenizer, proposer, 4)
        for prompt, expected in zip(PROMPTS, reference, strict=True):
            fast, slow = static.generate(prompt, params), dynamic.generate(prompt, params)
            assert fast.token_ids == expected
            assert fast.metrics.num_target_forwards == slow.metrics.num_target_forwards
