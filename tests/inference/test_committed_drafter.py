"""The shipped draft LM (in the shipped zoo) fits the shipped target and keeps its greedy output
exactly."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftzoo.architectures.drafter_io import check_drafter_target
from draftzoo.architectures.target import TargetAdapter
from draftzoo.architectures.zoo_index import ZooIndex, builtin_zoo_dir
from draftzoo.data.prompts import humaneval_prompts
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.proposers import DraftModelProposer
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.testbed import committed_testbed_dir


def test_committed_draft_lm_is_lossless_and_accepted():
    drafter = ZooIndex(builtin_zoo_dir()).folder("draft-lm-testbed-small")
    target = TargetAdapter.from_pretrained(committed_testbed_dir())
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
