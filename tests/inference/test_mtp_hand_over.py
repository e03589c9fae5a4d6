"""MTP hand-over conventions: the proposer drafts what vLLM's `deepseek_mtp` (`residual`) and
SGLang's `deepseek_nextn` (`normed`) compute — their forwards re-enacted on the drafter's own
tensors — and the two really differ; a `residual` drafter trains, records its convention,
serves losslessly, and exports only for the engine that drafts what was measured."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftzoo.architectures.errors import ExportError
from draftzoo.architectures.mtp import MtpConfig, load_mtp
from draftzoo.architectures.mtp_export import check_convention, serving_note
from draftzoo.architectures.target import TargetAdapter
from draftzoo.inference.generate import SpeculativeGenerator, fused_states
from draftzoo.inference.load import load_drafter
from draftzoo.inference.proposal_settings import from_name
from draftzoo.inference.proposers.mtp import MtpProposer
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.mtp import run
from tests.inference.helpers import PROMPTS
from tests.train.helpers import tiny_mtp_recipe, write_chat_jsonl


@pytest.fixture(scope="module")
def residual_drafter(testbed_tiny, tmp_path_factory) -> Path:
    """One module trained 30 steps with vLLM's hand-over on testbed-tiny (real steps)."""
    root = tmp_path_factory.mktemp("mtp-residual")
    chat = write_chat_jsonl(root / "chat.jsonl", 48)
    recipe = tiny_mtp_recipe(
        root / "run",
        testbed_tiny[0],
        chat,
        mtp={"depth": 1, "loss": "distill", "hand_over": "residual"},
        train={"max_steps": 30, "lr": 5e-3, "warmup_steps": 2, "checkpoint_every": 100},
    )
    run(recipe)
    return Path(recipe.output_dir)


def _engine_chain(drafter, states, ids, drafts, engine: str) -> list[torch.Tensor]:
    """Each draft step's distribution as the engine computes it, recomputed from scratch over
    the whole sequence (what its KV cache holds): its first module at every step, fed token
    x_{i+1} and the previous state at position i. vLLM: embedding zeroed at position 0, the
    block's output handed over, `shared_head.norm` before the head; SGLang: the post-norm
    output handed over and read by the head."""
    layer = drafter.layers[0]
    tokens = list(ids[1:])
    previous = states[: len(ids) - 1]
    out = []
    for step in range(len(drafts)):
        n = len(tokens)
        positions = torch.arange(n)[None]
        embeds = drafter.embed_tokens(torch.tensor([tokens]))
        if engine == "vllm":
            embeds = embeds.masked_fill((positions == 0)[..., None], 0.0)
        x = layer.eh_proj(torch.cat([layer.enorm(embeds), layer.hnorm(previous[None])], -1))
        causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
        block = layer.mtp_block(
            x,
            attention_mask=causal,
            position_embeddings=drafter.rotary(x, positions),
            position_ids=positions,
        )[0]
        normed = layer.post_norm(block[-1])
        out.append(torch.softmax(drafter.head.lm_head(normed).float(), -1))
        handed = block[-1] if engine == "vllm" else normed
        tokens.append(int(drafts[step]))
        previous = torch.cat([previous, handed[None]])
    return out


@torch.no_grad()
@pytest.mark.parametrize("hand_over,engine", [("residual", "vllm"), ("normed", "sglang")])
def test_the_proposer_drafts_what_the_engine_of_its_convention_computes(
    residual_drafter, target_and_tokenizer, hand_over, engine
):
    model, tokenizer = target_and_tokenizer
    adapter = TargetAdapter(model, tokenizer)
    drafter = load_mtp(residual_drafter, adapter, hand_over=hand_over)
    proposer = MtpProposer(drafter)
    ids = tokenizer(PROMPTS[0], add_special_tokens=False).input_ids
    with adapter.capture(proposer.target_layers) as captured:
        model(input_ids=torch.tensor([ids]))
        states = fused_states(captured, proposer.target_layers)[0]
    proposer.observe(states[: len(ids) - 1])
    params = SamplingParams(temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    proposal = proposer.propose(ids, 4, params, generator)
    drafts = [int(t) for t in proposal.tokens]
    engine_q = _engine_chain(drafter, states, ids, drafts, engine)
    for step, q in enumerate(engine_q):
        torch.testing.assert_close(proposal.draft_probs[step], q, atol=1e-5, rtol=1e-4)
    # the other engine drafts something else from the same weights: the convention matters
    other = _engine_chain(drafter, states, ids, drafts, "sglang" if engine == "vllm" else "vllm")
    assert max(float((a - b).abs().max()) for a, b in zip(engine_q, other, strict=True)) > 1e-3


def test_a_residual_drafter_records_its_convention_and_serves_losslessly(
    residual_drafter, target_and_tokenizer, reference
):
    import json

    model, tokenizer = target_and_tokenizer
    config = json.loads((residual_drafter / "config.json").read_text())
    assert config["mtp_hand_over"] == "residual"
    runtime = load_drafter(residual_drafter, model, tokenizer, from_name("chain", 3))
    assert runtime.module.hand_over == "residual"
    assert not runtime.module.layers[0].use_post_norm  # the block's output is handed over
    generator = SpeculativeGenerator(model, tokenizer, runtime.make_proposer(), 3)
    params = SamplingParams(max_new_tokens=32)
    outputs = [generator.generate(p, params) for p in PROMPTS]
    assert [o.token_ids for o in outputs] == reference
    tokens = sum(o.metrics.num_generated_tokens for o in outputs)
    assert tokens / sum(o.metrics.num_target_forwards for o in outputs) > 1.2


def test_each_engine_format_needs_its_convention():
    deepseek = {"model_type": "deepseek_v3"}

    def config(hand_over, depth=1):
        return {
            "mtp_hand_over": hand_over,
            "num_nextn_predict_layers": depth,
            "target_config": deepseek,
        }

    check_convention(config("residual"), "vllm")
    check_convention(config("normed"), "sglang")
    check_convention({"num_nextn_predict_layers": 1}, "sglang")  # unrecorded: normed
    with pytest.raises(
        Exception, match=r"trained with mtp\.hand_over: normed, vllm drafts with residual"
    ):
        check_convention(config("normed"), "vllm")
    with pytest.raises(ExportError, match="export --format vllm, or retrain"):
        check_convention(config("residual"), "sglang")
    with pytest.raises(ExportError, match="SGLang's deepseek_nextn serves one module"):
        check_convention(config("normed", 2), "sglang")
    assert "vLLM (`deepseek_mtp`" in serving_note(config("residual"))
    assert "SGLang (`deepseek_nextn`" in serving_note(config("normed"))
    assert "No engine" in serving_note(config("normed", 2))
    llama = {**config("normed"), "target_config": {"model_type": "llama"}}
    assert "draftzoo's runtime serves it" in serving_note(llama)


def test_residual_with_more_than_one_module_is_refused():
    with pytest.raises(ValueError, match="runs the first module at every draft step"):
        MtpConfig(depth=2, hand_over="residual")
    with pytest.raises(ValueError, match=r"mtp\.hand_over must be one of"):
        MtpConfig(hand_over="pre-norm")


def test_the_card_says_which_engine_drafts_what_was_measured(residual_drafter):
    import json

    from draftzoo.architectures.families import family_spec
    from draftzoo.architectures.zoo_index import resolve_drafter
    from draftzoo.eval.model_card import render_card

    notes = family_spec("mtp").serving_notes(residual_drafter)
    assert notes[0].startswith("Hand-over `residual`, 1 module.")
    assert "this target is 'llama', so draftzoo's runtime serves it" in notes[0]
    shipped, _ = resolve_drafter("mtp-testbed-small")
    record = json.loads((shipped / "draftzoo.json").read_text())
    report = json.loads((shipped / "report.json").read_text())
    card = render_card("mtp-testbed-small", record, report, [], "draftzoo train R", notes)
    assert notes[0] in card.split("## Measured")[0]  # under "Use"
