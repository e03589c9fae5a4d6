"""The shipped drafters (in the shipped zoo) fit the shipped target and keep its greedy output
exactly; with the shipped EAGLE-3, EAGLE-2 trees are accepted further than chains."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftzoo.architectures.drafter_io import check_drafter_target
from draftzoo.architectures.target import TargetAdapter
from draftzoo.architectures.zoo_index import ZooIndex, builtin_zoo_dir
from draftzoo.data.prompts import humaneval_prompts
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.proposers.draft_lm import DraftModelProposer
from draftzoo.inference.proposers.eagle import EagleProposer, TreeSettings
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.testbed import committed_testbed_dir


@pytest.fixture(scope="module")
def target() -> TargetAdapter:
    """The shipped testbed-small target."""
    return TargetAdapter.from_pretrained(committed_testbed_dir())


def test_committed_draft_lm_is_lossless_and_accepted(target):
    drafter = ZooIndex(builtin_zoo_dir()).folder("draft-lm-testbed-small")
    record = check_drafter_target(drafter, target.fingerprint())
    assert record["family"] == "draft_lm" and record["recipe"]["distill"]["loss"] == "fkl"
    draft = AutoModelForCausalLM.from_pretrained(drafter, dtype=torch.float32)
    proposer = DraftModelProposer(draft, AutoTokenizer.from_pretrained(drafter), target.tokenizer)
    speculative = SpeculativeGenerator(target.model, target.tokenizer, proposer, 4)
    plain = SpeculativeGenerator(target.model, target.tokenizer)
    params = SamplingParams(max_new_tokens=48)
    tokens = forwards = 0
    for prompt in humaneval_prompts()[:3]:
        text = prompt.render(target.tokenizer, chat=True)
        out = speculative.generate(text, params)
        assert out.token_ids == plain.generate(text, params).token_ids
        tokens += out.metrics.num_generated_tokens
        forwards += out.metrics.num_target_forwards
    assert tokens / forwards > 1.5  # the draft is really accepted


def test_committed_eagle3_trees_beat_chains_losslessly(target):
    """Greedy, 5 HumanEval prompts: chain tau 3.12, the CPU-sized tree 3.43, the default tree
    4.07 when this was written; every output equals target-only decoding."""
    drafter = ZooIndex(builtin_zoo_dir()).folder("eagle3-testbed-small")
    plain = SpeculativeGenerator(target.model, target.tokenizer)
    params = SamplingParams(max_new_tokens=48)
    texts = [p.render(target.tokenizer, chat=True) for p in humaneval_prompts()[:5]]
    reference = [plain.generate(text, params).token_ids for text in texts]
    taus = {}
    shapes = {
        "chain": None,
        "cpu tree": TreeSettings(top_k=4, depth=5, total_tokens=12),
        "default tree": TreeSettings(),
    }
    for name, tree in shapes.items():
        proposer = EagleProposer.from_pretrained(drafter, target.model, target.tokenizer, tree)
        speculative = SpeculativeGenerator(target.model, target.tokenizer, proposer, 4)
        outs = [speculative.generate(text, params) for text in texts]
        assert [o.token_ids for o in outs] == reference, name
        taus[name] = sum(o.metrics.num_generated_tokens for o in outs) / sum(
            o.metrics.num_target_forwards for o in outs
        )
    assert taus["chain"] < taus["cpu tree"] < taus["default tree"], taus
