"""A draft vocabulary over the target's own head (EAGLE-1, MTP, DFlash): installed at export
from the run's supervised tokens, drafting only inside it, greedy output identical to the
target's, sampled proposals distributions over it, exports that say they do not carry it, and
a broken map refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftzoo.architectures.drafter_io import DrafterError, read_drafter_record
from draftzoo.architectures.export import describe_export, export_drafter
from draftzoo.architectures.target_head import kept_ids
from draftzoo.data.draft_vocab import count_supervised_tokens
from draftzoo.data.token_dataset import build_token_dataset
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.load import load_drafter
from draftzoo.inference.proposal_settings import from_name
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.registry import run_recipe
from draftzoo.train.setup import load_target
from tests.inference.helpers import PROMPTS, RecordingProposer
from tests.train.helpers import (
    tiny_dflash_recipe,
    tiny_eagle_recipe,
    tiny_mtp_recipe,
    write_chat_jsonl,
)

SIZE = 96  # of testbed-tiny's vocabulary
TRAIN = {"max_steps": 12, "lr": 5e-3, "warmup_steps": 2, "checkpoint_every": 100}
RECIPES = {
    "eagle1": lambda root, target, chat: tiny_eagle_recipe(
        root, target, chat, eagle={"kind": "eagle1", "draft_vocab_size": SIZE}, train=TRAIN
    ),
    "mtp": lambda root, target, chat: tiny_mtp_recipe(
        root, target, chat, mtp={"draft_vocab_size": SIZE}, train=TRAIN
    ),
    "dflash": lambda root, target, chat: tiny_dflash_recipe(
        root, target, chat, dflash={"draft_vocab_size": SIZE, "layers": [1]}, train=TRAIN
    ),
}
#: the layout each family exports to an engine in (its drafter file)
ENGINE_FORMAT = {"eagle1": "vllm", "dflash": "vllm"}


@pytest.fixture(scope="module")
def trained(testbed_tiny, tmp_path_factory) -> dict[str, tuple[object, Path]]:
    """Each family trained briefly with a draft vocabulary of SIZE (real steps)."""
    root = tmp_path_factory.mktemp("target-head")
    chat = write_chat_jsonl(root / "chat.jsonl", 48)
    out = {}
    for family, make in RECIPES.items():
        recipe = make(root / family, testbed_tiny[0], chat)
        run_recipe(recipe)
        out[family] = (recipe, Path(recipe.output_dir))
    return out


@pytest.mark.parametrize("family", sorted(RECIPES))
def test_the_map_is_the_runs_most_frequent_supervised_tokens(trained, family):
    recipe, folder = trained[family]
    record = read_drafter_record(folder)
    config = json.loads((folder / "config.json").read_text())
    tensors = load_file(folder / "model.safetensors")
    assert config["draft_vocab_size"] == SIZE == record["training"]["draft_vocab_size"]
    assert record["training"]["draft_vocab"] == "the target's head truncated at export"
    target = load_target(recipe.target, "cpu")
    dataset = build_token_dataset(recipe.data, target.tokenizer, Path(recipe.cache_dir))[0]
    counts = count_supervised_tokens(dataset, len(tensors["t2d"]))
    ids = kept_ids(tensors["d2t"])
    # the SIZE most frequent (ties to the lower id), in ascending order
    order = sorted(range(len(counts)), key=lambda i: (-int(counts[i]), i))[:SIZE]
    assert ids.tolist() == sorted(order)
    assert tensors["t2d"].nonzero().flatten().tolist() == ids.tolist()
    covered = float(counts[ids].sum()) / float(counts.sum())
    assert record["training"]["draft_vocab_coverage"] == pytest.approx(covered, abs=1e-6)


@pytest.mark.parametrize("family", sorted(RECIPES))
def test_greedy_drafts_stay_in_the_vocabulary_and_the_output_is_the_targets(
    trained, target_and_tokenizer, reference, family
):
    _, folder = trained[family]
    model, tokenizer = target_and_tokenizer
    runtime = load_drafter(folder, model, tokenizer, from_name("chain", 3))
    recording = RecordingProposer(runtime.make_proposer())
    generator = SpeculativeGenerator(model, tokenizer, recording, 3)
    params = SamplingParams(max_new_tokens=32)
    outputs = [generator.generate(p, params).token_ids for p in PROMPTS]
    assert outputs == reference
    kept = set(kept_ids(load_file(folder / "model.safetensors")["d2t"]).tolist())
    drafted = [t for tokens, _ in recording.proposals for t in tokens]
    assert drafted and set(drafted) <= kept
    # the truncated projection is the whole head's at the kept rows
    module = runtime.module
    states = torch.randn(5, model.config.hidden_size)
    ids = sorted(kept)
    if family == "eagle1":
        assert torch.allclose(module.logits(states), model.lm_head(states)[:, ids], atol=1e-5)
    else:
        head = module.head
        full = model.lm_head(states)
        logits = head.logits(states)
        assert torch.allclose(logits[:, ids], full[:, ids], atol=1e-5)
        off = torch.ones(full.shape[-1], dtype=torch.bool)
        off[ids] = False
        assert bool(torch.isneginf(logits[:, off]).all())


@pytest.mark.parametrize("family", sorted(RECIPES))
def test_sampled_proposals_are_distributions_over_the_vocabulary(
    trained, target_and_tokenizer, family
):
    """At T = 1 every drafted token's q sums to one, lies in the draft vocabulary and gives
    the drafted token mass; the target-only check of losslessness is the runtime's (the
    acceptance test reads q as it is, whatever its support)."""
    _, folder = trained[family]
    model, tokenizer = target_and_tokenizer
    runtime = load_drafter(folder, model, tokenizer, from_name("chain", 3))
    proposer = runtime.make_proposer()
    kept = kept_ids(load_file(folder / "model.safetensors")["d2t"])
    seen = []

    class Checking(RecordingProposer):
        def propose(self, context, max_tokens, params, generator):
            proposal = self.inner.propose(context, max_tokens, params, generator)
            if proposal.draft_probs is not None:
                seen.append((torch.as_tensor(proposal.tokens), proposal.draft_probs))
            return proposal

    generator = SpeculativeGenerator(model, tokenizer, Checking(proposer), 3)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=3)
    for prompt in PROMPTS[:2]:
        generator.generate(prompt, params)
    assert seen
    off = torch.ones(model.config.vocab_size, dtype=torch.bool)
    off[kept] = False
    for tokens, q in seen:
        q = q.float()
        assert torch.allclose(q.sum(-1), torch.ones(len(q)), atol=1e-4)
        assert float(q[:, off].abs().max()) == 0.0
        assert bool((q[torch.arange(len(q)), tokens.long()] > 0).all())


@pytest.mark.parametrize("family", sorted(ENGINE_FORMAT))
def test_an_engine_export_leaves_the_map_out_and_says_so(trained, family, tmp_path):
    _, folder = trained[family]
    out = export_drafter(folder, tmp_path / "export", ENGINE_FORMAT[family])
    weights = load_file(out / "model.safetensors")
    assert not {"d2t", "t2d"} & set(weights)
    config = json.loads((out / "config.json").read_text())
    assert "not carried" in config["draftzoo"]["draft_vocabulary"]
    assert any(line.startswith("draft vocabulary: not carried") for line in describe_export(out))


@pytest.mark.parametrize("family", sorted(RECIPES))
def test_a_broken_map_is_refused_in_one_line(trained, target_and_tokenizer, family, tmp_path):
    import shutil

    _, folder = trained[family]
    model, tokenizer = target_and_tokenizer
    copy = tmp_path / "broken"
    shutil.copytree(folder, copy)
    tensors = load_file(copy / "model.safetensors")
    tensors["d2t"] = tensors["d2t"].flip(0)  # no longer ascending target ids
    save_file(tensors, str(copy / "model.safetensors"))
    with pytest.raises(DrafterError) as caught:
        load_drafter(copy, model, tokenizer, from_name("chain", 3))
    said = str(caught.value)
    assert "\n" not in said and "d2t does not map draft ids" in said, said


def test_the_card_says_what_it_drafts_over(trained, target_and_tokenizer, tmp_path):
    from draftzoo.eval.publish import publish
    from draftzoo.eval.runner import EvalConfig, evaluate, write_report

    recipe, folder = trained["mtp"]
    model, tokenizer = target_and_tokenizer
    drafter = load_drafter(folder, model, tokenizer, from_name("chain", 3))
    config = EvalConfig(max_prompts=2, max_new_tokens=16, temperatures=(0.0,))
    report = evaluate(model, tokenizer, drafter, config, recipe.target.path, show_progress=False)
    published = publish(folder, write_report(report, tmp_path / "report"), tmp_path / "zoo", "m")
    card = (published / "README.md").read_text()
    covered = read_drafter_record(folder)["training"]["draft_vocab_coverage"]
    assert (
        f"Draft vocabulary: it drafts over {SIZE:,} of the target's "
        f"{model.config.vocab_size:,} tokens (the most frequent supervised tokens of its "
        f"training data, {covered:.1%} of them): the target's head truncated at export."
    ) in " ".join(card.split())


def test_the_note_names_a_trained_head_and_nothing_for_a_whole_vocabulary():
    from draftzoo.eval.model_card import draft_vocabulary_note

    eagle3 = draft_vocabulary_note({"vocab_size": 1000, "draft_vocab_size": 100}, {})
    assert "over 100 of the target's 1,000 tokens" in eagle3[0]
    assert "its own head trained over them" in eagle3[0]
    medusa = {"vocab_size": 1000, "truncated_vocab_size": 10}
    assert "over 10 of" in draft_vocabulary_note(medusa, {})[0]
    assert draft_vocabulary_note({"vocab_size": 1000, "draft_vocab_size": 1000}, {}) == []
    assert draft_vocabulary_note({"vocab_size": 1000}, {}) == []


def test_a_map_installed_on_an_attached_drafter_drafts_over_it(testbed_tiny):
    """What export installs leaves the module consistent: its head drafts over the map at
    once (its ids and its logits agree), as the loaded drafter does."""
    from transformers import AutoModelForCausalLM

    from draftzoo.architectures.mtp import MtpConfig, build_mtp
    from draftzoo.architectures.target import TargetAdapter
    from draftzoo.architectures.target_head import install_vocab_map
    from draftzoo.data.draft_vocab import build_vocab_map

    model = AutoModelForCausalLM.from_pretrained(testbed_tiny[0], dtype=torch.float32)
    drafter = build_mtp(MtpConfig(), TargetAdapter(model))
    vocab = model.config.vocab_size
    d2t, t2d = build_vocab_map(torch.arange(vocab, 0, -1), 16)
    install_vocab_map(drafter, d2t, t2d)
    logits = drafter.logits(torch.randn(3, model.config.hidden_size))
    assert drafter.fields["draft_vocab_size"] == 16
    assert torch.isfinite(logits).sum(-1).tolist() == [16, 16, 16]
    assert bool(torch.isfinite(logits[:, :16]).all())  # the 16 most frequent: the lowest ids
