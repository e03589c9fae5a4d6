"""Teacher-forced acceptance: its distributions are the chain's, and its scores add up."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftzoo.architectures.eagle import load_eagle
from draftzoo.architectures.target import TargetAdapter
from draftzoo.eval.teacher_forced import (
    proposable,
    target_sequences,
    teacher_forced_results,
    teacher_forced_scores,
    unrolled_distributions,
)
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.proposers.eagle import EagleProposer
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.eagle import run
from tests.inference.helpers import PROMPTS
from tests.train.helpers import tiny_eagle_recipe, write_chat_jsonl

STEPS = 3


@pytest.fixture(scope="module")
def drafters(testbed_tiny, tmp_path_factory) -> dict[str, Path]:
    """EAGLE-1, and EAGLE-3 on a pruned 128-token draft vocabulary, trained 20 real steps."""
    root = tmp_path_factory.mktemp("teacher-forced")
    chat = write_chat_jsonl(root / "chat.jsonl", 24)
    train = {"max_steps": 20, "lr": 5e-3, "warmup_steps": 2, "checkpoint_every": 100}
    out = {}
    for kind, eagle in (
        ("eagle1", {"kind": "eagle1"}),
        ("eagle3", {"kind": "eagle3", "draft_vocab_size": 128}),
    ):
        recipe = tiny_eagle_recipe(root / kind, testbed_tiny[0], chat, eagle=eagle, train=train)
        run(recipe)
        out[kind] = Path(recipe.output_dir)
    return out


class Recorder:
    """A proposer that records every round's context and proposal."""

    def __init__(self, inner: EagleProposer) -> None:
        self.inner, self.rounds = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, context, max_tokens, params, generator):
        proposal = self.inner.propose(context, max_tokens, params, generator)
        self.rounds.append((list(context), proposal))
        return proposal


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_unrolled_distributions_are_the_chains(drafters, tiny_target_model, kind):
    """Every sampled chain round's q_j equals the unroll's at the round's position, on the
    sequence continued by that round's drafts."""
    model, tokenizer, _ = tiny_target_model
    adapter = TargetAdapter(model, tokenizer)
    drafter = load_eagle(drafters[kind], adapter)
    recorder = Recorder(EagleProposer(drafter))
    generator = SpeculativeGenerator(model, tokenizer, recorder, STEPS)
    for seed, prompt in enumerate(PROMPTS):
        generator.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=32, seed=seed))
    params = SamplingParams(temperature=1.0)
    full = [(c, p) for c, p in recorder.rounds if len(p.tokens) == STEPS]
    assert len(full) >= 3
    for context, proposal in full:
        ids = torch.tensor([context + proposal.tokens])
        _, qs = unrolled_distributions(drafter, adapter, ids, params, STEPS)
        t = len(context) - 2
        for j in range(STEPS):
            torch.testing.assert_close(qs[j][t], proposal.draft_probs[j], atol=2e-5, rtol=1e-4)


def test_scores_add_up_and_pruned_tokens_are_outside(drafters, tiny_target_model):
    model, tokenizer, _ = tiny_target_model
    adapter = TargetAdapter(model, tokenizer)
    e1 = load_eagle(drafters["eagle1"], adapter)
    e3 = load_eagle(drafters["eagle3"], adapter)
    assert int(proposable(e3).sum()) == 128 and bool(proposable(e1).all())
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, max_new_tokens=20, seed=0)
        sequences = target_sequences(model, tokenizer, PROMPTS[:2], params)
        scored = sum(len(ids) - STEPS - (n - 2) for ids, n in sequences)
        full = teacher_forced_scores(e1, adapter, sequences, params, STEPS, proposable(e3))
        pruned = teacher_forced_scores(e3, adapter, sequences, params, STEPS, proposable(e3))
        assert full.positions == pruned.positions == scored
        assert full.outside_mass == 0.0
        if temperature:  # every token has some target mass
            assert 0.0 < pruned.outside_mass < 1.0
        else:  # the target's mass is all on the sequence's next token, its greedy choice
            t2d = proposable(e3)
            # step 0 from position t predicts x_{t+2}, t = n - 2 .. len - 1 - STEPS
            outside = [not t2d[x] for ids, n in sequences for x in ids[n : len(ids) - STEPS + 2]]
            assert len(outside) == scored
            assert pruned.outside_mass == pytest.approx(sum(outside) / scored)
        for a, b, c in zip(full.acceptance, full.within, pruned.acceptance, strict=True):
            assert 0.0 <= b <= a <= 1.0 and 0.0 <= c <= 1.0 - pruned.outside_mass + 1e-6
        # a pruned drafter's overlap is its overlap inside its own vocabulary
        assert pruned.within == pytest.approx(pruned.acceptance)
        a0, a1, a2 = full.acceptance
        assert full.tau == pytest.approx(1 + a0 + a0 * a1 + a0 * a1 * a2)


def test_greedy_scores_count_agreeing_argmaxes(drafters, tiny_target_model):
    """At T = 0 step 0 scores the share of positions where the drafter's argmax is the
    target's next greedy token, counted here directly from the drafter's logits."""
    model, tokenizer, _ = tiny_target_model
    adapter = TargetAdapter(model, tokenizer)
    drafter = load_eagle(drafters["eagle3"], adapter)
    params = SamplingParams(temperature=0.0, max_new_tokens=20)
    sequences = target_sequences(model, tokenizer, PROMPTS[:2], params)
    hits = total = 0
    for tokens, n in sequences:
        ids = torch.tensor([tokens])
        out = adapter(ids, hidden_indices=sorted({*drafter.layers, adapter.num_layers}))
        states = torch.cat([out.hidden_states[k] for k in drafter.layers], dim=-1)
        s = len(tokens)
        allowed = torch.ones(s, s, dtype=torch.bool).tril()[None, None]
        with torch.no_grad():
            (hidden,) = drafter.ttt_unroll(
                ids, drafter.fuse(states), torch.arange(s)[None], allowed, 1
            )
            drafts = drafter.to_target_ids(drafter.logits(hidden[0]).argmax(-1))
        for t in range(n - 2, s - 1):
            hits += int(drafts[t] == out.logits[0, t + 1].argmax())
            total += 1
    scores = teacher_forced_scores(drafter, adapter, sequences, params, 1)
    assert scores.positions == total
    assert scores.acceptance[0] == pytest.approx(hits / total)


def test_first_step_split_by_draft_position_adds_up(drafters, tiny_target_model):
    """The buckets partition step 0's positions by where the draft lands (t + 2) and their
    weighted mean is step 0's acceptance."""
    model, tokenizer, _ = tiny_target_model
    adapter = TargetAdapter(model, tokenizer)
    drafter = load_eagle(drafters["eagle1"], adapter)
    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=0)
    sequences = target_sequences(model, tokenizer, PROMPTS[:2], params)
    edges = (12, 20)
    scores = teacher_forced_scores(drafter, adapter, sequences, params, STEPS, position_edges=edges)
    buckets = scores.by_position
    assert [(b.start, b.end) for b in buckets] == [(0, 12), (12, 20), (20, None)]
    # draft positions t + 2 for t = n - 2 .. len - 1 - STEPS
    lands = [t + 2 for ids, n in sequences for t in range(n - 2, len(ids) - STEPS)]
    expected = [sum(a <= x < (b or 10**9) for x in lands) for a, b in ((0, 12), (12, 20), (20, 0))]
    assert all(expected), expected  # every bucket holds drafts
    assert [b.positions for b in buckets] == expected and sum(expected) == scores.positions
    mean = sum(b.acceptance * b.positions for b in buckets) / scores.positions
    assert mean == pytest.approx(scores.acceptance[0])
    assert teacher_forced_scores(drafter, adapter, sequences, params, STEPS).by_position is None
    with pytest.raises(ValueError, match="must increase"):
        teacher_forced_scores(drafter, adapter, sequences, params, STEPS, position_edges=(8, 8))


def test_first_step_split_into_repeated_and_fresh_drafts_adds_up(drafters, tiny_target_model):
    """Step 0 splits by whether the sequence's token at the draft's position (t + 2) repeats
    an earlier bigram of the sequence; the two subsets partition the scored positions and
    their weighted mean is step 0's acceptance. The report entry carries both."""
    model, tokenizer, _ = tiny_target_model
    adapter = TargetAdapter(model, tokenizer)
    drafter = load_eagle(drafters["eagle3"], adapter)
    params = SamplingParams(temperature=0.0, max_new_tokens=40)
    sequences = target_sequences(model, tokenizer, PROMPTS[:2], params)
    scores = teacher_forced_scores(drafter, adapter, sequences, params, STEPS)
    by_hand = 0
    for ids, n in sequences:
        for t in range(n - 2, len(ids) - STEPS):
            pair = (ids[t + 1], ids[t + 2])
            by_hand += any((ids[j - 1], ids[j]) == pair for j in range(1, t + 2))
    repeated, fresh = scores.repeated, scores.fresh
    assert repeated.positions == by_hand > 0 and fresh.positions > 0
    assert repeated.positions + fresh.positions == scores.positions
    mean = (repeated.acceptance * repeated.positions + fresh.acceptance * fresh.positions) / (
        scores.positions
    )
    assert mean == pytest.approx(scores.acceptance[0])
    (entry,) = teacher_forced_results(model, tokenizer, drafter, PROMPTS[:2], (0.0,), 40, STEPS)
    assert entry["first_step_repeated"] == {
        "acceptance": pytest.approx(repeated.acceptance),
        "positions": repeated.positions,
    }
    assert entry["first_step_fresh"]["positions"] == fresh.positions
