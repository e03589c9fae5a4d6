"""MTP proposers in the runtime: greedy identity (D = 1 and 2, batch 1 and 4), the catch-up
computing exactly what training computes, the cache holding only real entries, loading."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftzoo.architectures.target import TargetAdapter
from draftzoo.inference.batch import BatchGenerator
from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.generate import SpeculativeGenerator, fused_states
from draftzoo.inference.load import load_drafter
from draftzoo.inference.proposal_settings import from_name
from draftzoo.inference.proposer import ProposerError
from draftzoo.inference.proposers.mtp import MtpProposer
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.mtp import run
from tests.inference.helpers import PROMPTS, RecordingProposer, assert_reads_per_round
from tests.train.helpers import tiny_mtp_recipe, write_chat_jsonl


@pytest.fixture(scope="module")
def drafters(testbed_tiny, tmp_path_factory) -> dict[int, Path]:
    """MTP drafters of depth 1 and 2 trained briefly on testbed-tiny (real steps)."""
    root = tmp_path_factory.mktemp("mtp")
    chat = write_chat_jsonl(root / "chat.jsonl", 48)
    out = {}
    for depth in (1, 2):
        recipe = tiny_mtp_recipe(
            root / f"d{depth}",
            testbed_tiny[0],
            chat,
            mtp={"depth": depth, "loss": "distill"},
            train={"max_steps": 40, "lr": 5e-3, "warmup_steps": 2, "checkpoint_every": 100},
        )
        run(recipe)
        out[depth] = Path(recipe.output_dir)
    return out


@pytest.mark.parametrize("depth", [1, 2])
def test_a_greedy_round_reads_the_host_once(drafters, target_and_tokenizer, reference, depth):
    """The modules' drafts stay on the device, fed back as tensors; the verification reads
    them with the target's argmax, once per round (chains past the modules included)."""
    model, tokenizer = target_and_tokenizer
    proposer = MtpProposer.from_pretrained(drafters[depth], model, tokenizer)
    generator = SpeculativeGenerator(
        model, tokenizer, proposer, 3, cache=CacheSettings(static=True, max_length=256)
    )
    params = SamplingParams(max_new_tokens=32)
    assert_reads_per_round(generator, PROMPTS, reference, params)


@pytest.mark.parametrize("depth", [1, 2])
def test_static_modules_propose_what_the_growing_cache_proposes(
    drafters, target_and_tokenizer, reference, depth, monkeypatch
):
    """The modules on static caches — eagerly, and on the buffers a CUDA graph captures (run
    eagerly off CUDA) — draft the growing cache's chains in every round, past the modules
    too (chains of 4 from 1 or 2 modules); the growing buffers enlarged many times (8 slots
    at a time) on the way."""
    from draftzoo.inference.proposers.mtp_slots import ModuleSlots

    monkeypatch.setattr(ModuleSlots, "GROW", 8)
    model, tokenizer = target_and_tokenizer
    drafter = MtpProposer.from_pretrained(drafters[depth], model, tokenizer).drafter
    params = SamplingParams(max_new_tokens=32)
    proposals = {}
    for name in ("growing", "static", "graph-buffers"):
        inner = MtpProposer(drafter, cache=CacheSettings(static=name != "growing", max_length=256))
        if name == "graph-buffers":
            inner.slots.use_graphs = True
        proposer = RecordingProposer(inner)
        generator = SpeculativeGenerator(model, tokenizer, proposer, 4)
        outs = [generator.generate(p, params) for p in PROMPTS]
        assert [o.token_ids for o in outs] == reference, name
        proposals[name] = proposer.proposals
        if name == "growing":
            assert inner.slots.size > 32  # grown from 8 slots
    assert proposals["static"] == proposals["growing"] == proposals["graph-buffers"]
    assert inner.slots._graphs  # the graph-buffer path really ran


@pytest.mark.parametrize("depth", [1, 2])
def test_greedy_output_equals_target_only_batch_1_and_4(
    drafters, target_and_tokenizer, reference, depth
):
    model, tokenizer = target_and_tokenizer
    proposer = MtpProposer.from_pretrained(drafters[depth], model, tokenizer)
    single = SpeculativeGenerator(model, tokenizer, proposer, num_speculative_tokens=3)
    params = SamplingParams(max_new_tokens=32)
    outputs = [single.generate(p, params) for p in PROMPTS]
    assert [o.token_ids for o in outputs] == reference
    tokens = sum(o.metrics.num_generated_tokens for o in outputs)
    forwards = sum(o.metrics.num_target_forwards for o in outputs)
    assert tokens / forwards > 1.2, f"depth {depth}: tau {tokens / forwards:.2f}"
    drafter = proposer.drafter
    batch = BatchGenerator(model, tokenizer, lambda: MtpProposer(drafter), num_speculative_tokens=3)
    out = batch.generate(PROMPTS, params)
    assert [o.token_ids for o in out.outputs] == reference


@torch.no_grad()
def test_catch_up_and_drafting_compute_what_training_computes(drafters, target_and_tokenizer):
    """The proposer's module outputs on committed tokens equal the training forward's at every
    position; each draft is the training forward's argmax at that depth once the earlier drafts
    are read as committed tokens (the forward runs on the prompt plus the first draft)."""
    model, tokenizer = target_and_tokenizer
    proposer = MtpProposer.from_pretrained(drafters[2], model, tokenizer)
    drafter = proposer.drafter
    ids = tokenizer(PROMPTS[0], add_special_tokens=False).input_ids
    n = len(ids)
    proposer.observe(_states(model, proposer, ids)[: n - 1])
    drafted = proposer.propose(ids, 2, SamplingParams(), None).tokens
    context = [*ids, drafted[0]]
    depth1, depth2 = _training_forward(drafter, context, _states(model, proposer, context))
    # module 1's real outputs (positions 0 .. n-2) are module 2's inputs
    torch.testing.assert_close(proposer.inputs[1], depth1[: n - 1], atol=1e-4, rtol=1e-4)
    assert drafted[0] == int(drafter.logits(depth1[n - 2]).argmax())
    # module 2 at n-2 read x_n, the first draft: the training forward over `context` there
    assert drafted[1] == int(drafter.logits(depth2[n - 2]).argmax())
    # module 2's entry at n-3 read x_{n-1}, committed: a real one; the drafted one is not
    assert proposer.fed == [n - 1, n - 2]


def _states(model, proposer, ids: list[int]) -> torch.Tensor:
    """The target's final post-norm states [len(ids), h]."""
    with TargetAdapter(model).capture(proposer.target_layers) as captured:
        model(input_ids=torch.tensor([ids]))
        return fused_states(captured, proposer.target_layers)[0]


def _training_forward(drafter, ids: list[int], states: torch.Tensor) -> list[torch.Tensor]:
    """Each depth's outputs [len(ids), h] from the training forward (causal, one sample)."""
    n = len(ids)
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    select = [torch.ones(1, n, dtype=torch.bool)] * drafter.depth
    return drafter(torch.tensor([ids]), states[None], torch.arange(n)[None], causal, select)


def test_load_drafter_serves_chains_longer_than_the_modules_and_refuses_trees(
    drafters, target_and_tokenizer, reference
):
    model, tokenizer = target_and_tokenizer
    runtime = load_drafter(drafters[1], model, tokenizer, from_name("chain", 4))
    assert runtime.family == "mtp" and runtime.module.depth == 1
    generator = SpeculativeGenerator(model, tokenizer, runtime.make_proposer(), 4)
    out = generator.generate(PROMPTS[1], SamplingParams(max_new_tokens=32))
    assert out.token_ids == reference[1]
    assert len(out.metrics.acceptance_per_position) == 4
    with pytest.raises(ProposerError, match="chains only"):
        load_drafter(drafters[1], model, tokenizer, from_name("tree", None))


def test_sampling_is_seeded(drafters, target_and_tokenizer):
    model, tokenizer = target_and_tokenizer
    proposer = MtpProposer.from_pretrained(drafters[2], model, tokenizer)
    generator = SpeculativeGenerator(model, tokenizer, proposer, num_speculative_tokens=3)
    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=3)
    out = generator.generate(PROMPTS[0], params)
    assert out.metrics.num_draft_tokens > 0
    assert generator.generate(PROMPTS[0], params).token_ids == out.token_ids


def test_generate_command_drafts_with_mtp(drafters, testbed_tiny, capsys):
    from draftzoo.cli import main

    args = ["generate", "--target", str(testbed_tiny[0]), "--drafter", str(drafters[2])]
    args += ["--prompt", PROMPTS[0], "--max-new-tokens", "16", "--num-speculative-tokens", "3"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith(PROMPTS[0]) and "mean_acceptance_length:" in out
