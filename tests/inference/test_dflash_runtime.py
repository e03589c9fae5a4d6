"""DFlash proposers in the runtime: greedy identity (growing and static entries, batch 1 and
4), one drafter forward drafting what training computes for the same block, lossless sampling,
loading and its refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftzoo.architectures.dflash import DflashConfig, build_dflash
from draftzoo.architectures.target import FingerprintMismatchError, TargetAdapter
from draftzoo.inference.batch import BatchGenerator
from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.generate import SpeculativeGenerator, fused_states
from draftzoo.inference.load import load_drafter
from draftzoo.inference.proposal_settings import from_name
from draftzoo.inference.proposer import ProposerError
from draftzoo.inference.proposers.dflash import DflashProposer
from draftzoo.inference.proposers.position_tree import PositionTree
from draftzoo.inference.sampling import SamplingParams
from draftzoo.inference.tree import TreeSettings
from draftzoo.train.dflash import run
from tests.inference.helpers import PROMPTS, RecordingProposer, assert_reads_per_round
from tests.inference.test_lossless_sampling import (
    PARAMS,
    _exact_distribution,
    _threshold,
    _tiny_lm,
    _tv,
    sample_outcomes,
)
from tests.train.helpers import tiny_dflash_recipe, write_chat_jsonl


@pytest.fixture(scope="module")
def drafter_dir(testbed_tiny, tmp_path_factory) -> Path:
    """A DFlash drafter (blocks of 4) trained briefly on testbed-tiny (real steps)."""
    root = tmp_path_factory.mktemp("dflash")
    chat = write_chat_jsonl(root / "chat.jsonl", 48)
    recipe = tiny_dflash_recipe(
        root,
        testbed_tiny[0],
        chat,
        dflash={"layers": [1]},
        train={"max_steps": 200, "lr": 5e-3, "warmup_steps": 2, "checkpoint_every": 400},
    )
    run(recipe)
    return Path(recipe.output_dir)


def test_greedy_output_equals_target_only_batch_1_and_4(
    drafter_dir, target_and_tokenizer, reference
):
    model, tokenizer = target_and_tokenizer
    proposer = DflashProposer.from_pretrained(drafter_dir, model, tokenizer)
    single = SpeculativeGenerator(model, tokenizer, proposer, num_speculative_tokens=3)
    params = SamplingParams(max_new_tokens=32)
    outputs = [single.generate(p, params) for p in PROMPTS]
    assert [o.token_ids for o in outputs] == reference
    tokens = sum(o.metrics.num_generated_tokens for o in outputs)
    forwards = sum(o.metrics.num_target_forwards for o in outputs)
    assert tokens / forwards > 1.2, f"tau {tokens / forwards:.2f}"
    drafter = proposer.drafter
    batch = BatchGenerator(model, tokenizer, lambda: DflashProposer(drafter), 3)
    assert [o.token_ids for o in batch.generate(PROMPTS, params).outputs] == reference


def test_static_entries_propose_what_growing_entries_propose(
    drafter_dir, target_and_tokenizer, reference, monkeypatch
):
    """Static buffers — eagerly, and read whole under a mask through the captured call a CUDA
    graph replays (run eagerly off CUDA) — draft the growing entries' chains in every round
    (the growing buffers enlarged 8 positions at a time on the way), with one host read a
    round."""
    from draftzoo.inference.proposers.dflash import ContextEntries

    monkeypatch.setattr(ContextEntries, "GROW", 8)
    model, tokenizer = target_and_tokenizer
    drafter = DflashProposer.from_pretrained(drafter_dir, model, tokenizer).drafter
    params = SamplingParams(max_new_tokens=32)
    proposals = {}
    for name in ("growing", "static", "graph-buffers"):
        cache = CacheSettings(static=name != "growing", max_length=256)
        inner = DflashProposer(drafter, cache)
        inner.entries.use_graphs = name == "graph-buffers"
        proposer = RecordingProposer(inner)
        generator = SpeculativeGenerator(model, tokenizer, proposer, 3, cache=cache)
        outs = [generator.generate(p, params) for p in PROMPTS]
        assert [o.token_ids for o in outs] == reference, name
        proposals[name] = proposer.proposals
        if name == "growing":
            assert inner.entries.size > 8  # grown
    assert proposals["static"] == proposals["growing"] == proposals["graph-buffers"]
    static = SpeculativeGenerator(model, tokenizer, DflashProposer(drafter, cache), 3, cache=cache)
    assert_reads_per_round(static, PROMPTS, reference, params)


@torch.no_grad()
def test_a_round_drafts_what_training_computes_for_that_block(drafter_dir, target_and_tokenizer):
    """The proposer's chain is the argmax of the training forward's block at the same anchor
    (all blocks' one-forward path, with the context before the anchor)."""
    from draftzoo.train.dflash_loss import block_attention

    model, tokenizer = target_and_tokenizer
    proposer = DflashProposer.from_pretrained(drafter_dir, model, tokenizer)
    drafter = proposer.drafter
    ids = tokenizer(PROMPTS[0], add_special_tokens=False).input_ids
    n = len(ids)
    with TargetAdapter(model).capture(proposer.target_layers) as captured:
        model(input_ids=torch.tensor([ids]))
        states = fused_states(captured, proposer.target_layers)
    proposer.observe(states[0, : n - 1])
    drafted = proposer.propose(ids, 3, SamplingParams(), None).tokens

    class Row:  # one unpacked row, the anchor at its last token
        input_ids = torch.tensor([ids])
        position_ids = torch.arange(n)[None]

    anchors, valid = torch.tensor([[n - 1]]), torch.tensor([[True]])
    block = drafter.block_inputs(torch.tensor([[ids[-1]]])).reshape(1, -1)
    positions = torch.arange(n - 1, n + 3)[None]
    mask = block_attention(Row, anchors, valid, drafter.block_size)
    hidden = drafter(states, Row.position_ids, block, positions, mask)
    assert list(drafted) == drafter.logits(hidden[0, 1:]).argmax(-1).tolist()
    assert proposer.entries.length == n - 1  # only real context entries are kept


def test_load_drafter_refuses_longer_chains_deeper_trees_and_another_target(
    drafter_dir, target_and_tokenizer, reference
):
    model, tokenizer = target_and_tokenizer
    runtime = load_drafter(drafter_dir, model, tokenizer, from_name("chain", 3))
    assert runtime.family == "dflash" and runtime.module.block_size == 4
    generator = SpeculativeGenerator(model, tokenizer, runtime.make_proposer(), 3)
    assert (
        generator.generate(PROMPTS[1], SamplingParams(max_new_tokens=32)).token_ids
        == (reference[1])
    )
    with pytest.raises(ProposerError, match="at most 3 tokens long; asked for 9"):
        load_drafter(drafter_dir, model, tokenizer, from_name("chain", 9))
    tree = load_drafter(drafter_dir, model, tokenizer, from_name("tree", 3))
    assert tree.settings.drafts_tree and tree.tree == PositionTree.default(3)
    assert tree.num_speculative_tokens == 3
    with pytest.raises(ProposerError, match="4 deep but the drafter's blocks draft 3"):
        load_drafter(drafter_dir, model, tokenizer, from_name("tree", 3, PositionTree()))
    with pytest.raises(ProposerError, match="trees of kind PositionTree"):
        load_drafter(drafter_dir, model, tokenizer, from_name("tree", 3, TreeSettings(top_k=4)))
    other = _tiny_lm(seed=0, sharpness=1.0)
    with pytest.raises(FingerprintMismatchError, match="built for another target"):
        load_drafter(drafter_dir, other, None, from_name("chain", 3))


#: a 9-node tree over the 3 drafted slots of blocks of 4
TREE = PositionTree(
    ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0))
)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("static", [False, True], ids=["growing", "static"])
def test_sampled_chains_and_trees_match_the_target_distribution(static, tree):
    """An untrained drafter (its slots' q far from p), every slot's draft sampled from its own
    q (trees: two i.i.d. draws per slot, recursive rejection over siblings): the speculative
    samples' TV distance to the exact target distribution stays under the threshold of
    tests/inference/test_lossless_sampling.py."""
    target = _tiny_lm(seed=0, sharpness=30.0)
    exact = _exact_distribution(target, PARAMS)
    torch.manual_seed(6)
    drafter = build_dflash(
        DflashConfig(block_size=4, layers=(1, 2), mask_token_id=0), TargetAdapter(target)
    ).eval()
    cache = CacheSettings(static=static, max_length=64)
    proposer = DflashProposer(drafter, cache, TREE if tree else None)
    proposer.entries.use_graphs = static  # the buffers read whole under a mask
    generator = SpeculativeGenerator(target, None, proposer, num_speculative_tokens=3)
    counts, accepted = sample_outcomes(generator)
    tv, threshold = _tv(counts, exact), _threshold(exact)
    assert tv < threshold, f"TV {tv:.4f} >= {threshold:.4f}"
    assert accepted > 0


@pytest.mark.parametrize("static", [False, True], ids=["growing", "static"])
def test_greedy_trees_equal_target_only_and_accept_more(
    drafter_dir, target_and_tokenizer, reference, static
):
    """A static tree over the slots' top-k candidates (one block forward a round, as chains):
    greedy output equals target-only, batch 1 and 4, and it commits at least what the chain of
    the same depth commits per target forward (the chain is one of its paths)."""
    model, tokenizer = target_and_tokenizer
    drafter = DflashProposer.from_pretrained(drafter_dir, model, tokenizer).drafter
    cache = CacheSettings(static=static, max_length=256)
    params = SamplingParams(max_new_tokens=32)
    tau = {}
    for name, tree in (("chain", None), ("tree", TREE)):
        generator = SpeculativeGenerator(model, tokenizer, DflashProposer(drafter, cache, tree), 3)
        outputs = [generator.generate(p, params) for p in PROMPTS]
        assert [o.token_ids for o in outputs] == reference, name
        forwards = sum(o.metrics.num_target_forwards for o in outputs)
        tau[name] = sum(o.metrics.num_generated_tokens for o in outputs) / forwards
    assert tau["tree"] >= tau["chain"], tau
    batch = BatchGenerator(model, tokenizer, lambda: DflashProposer(drafter, tree=TREE), 3)
    assert [o.token_ids for o in batch.generate(PROMPTS, params).outputs] == reference
