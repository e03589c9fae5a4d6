"""A draft LM with a draft vocabulary: trained over its whole head, the map of the run's most
frequent supervised tokens shipped beside its stock weights, drafting only inside it through
those rows (greedy output the target's, sampled q a distribution over the map), the map part
of the checkpoint, a broken one refused in one line, and the card saying what it drafts over."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftzoo.architectures.drafter_io import (
    DRAFT_VOCAB_FILE,
    DrafterError,
    checkpoint_hash,
    defining_files,
    read_drafter_record,
)
from draftzoo.architectures.target_head import DraftVocabHead, kept_ids
from draftzoo.data.draft_vocab import count_supervised_tokens
from draftzoo.data.token_dataset import build_token_dataset
from draftzoo.eval.model_card import draft_vocabulary_note
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.load import load_drafter
from draftzoo.inference.proposal_settings import from_name
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.draft_lm import run
from draftzoo.train.setup import load_target
from tests.inference.helpers import PROMPTS, RecordingProposer
from tests.train.helpers import tiny_recipe, write_chat_jsonl

SIZE = 96  # of testbed-tiny's vocabulary
DRAFT = {
    "hidden_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "draft_vocab_size": SIZE,
}
TRAIN = {"max_steps": 12, "lr": 5e-3, "warmup_steps": 2, "checkpoint_every": 100}


@pytest.fixture(scope="module")
def trained(testbed_tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("draft-lm-vocab")
    chat = write_chat_jsonl(root / "chat.jsonl", 48)
    recipe = tiny_recipe(root, testbed_tiny[0], chat, draft=DRAFT, train=TRAIN)
    run(recipe)
    return recipe, Path(recipe.output_dir)


def _kept(folder: Path) -> list[int]:
    return kept_ids(load_file(folder / DRAFT_VOCAB_FILE)["d2t"]).tolist()


def test_the_map_ships_beside_stock_weights(trained):
    recipe, folder = trained
    record = read_drafter_record(folder)
    assert record["draft_vocab_file"] == DRAFT_VOCAB_FILE
    assert record["training"]["draft_vocab_size"] == SIZE
    assert DRAFT_VOCAB_FILE in defining_files(folder)
    # the run's SIZE most frequent supervised tokens (ties to the lower id), ascending
    target = load_target(recipe.target, "cpu")
    dataset = build_token_dataset(recipe.data, target.tokenizer, Path(recipe.cache_dir))[0]
    vocab = target.config.vocab_size
    counts = count_supervised_tokens(dataset, vocab)
    order = sorted(range(vocab), key=lambda i: (-int(counts[i]), i))[:SIZE]
    assert _kept(folder) == sorted(order)
    covered = float(counts[sorted(order)].sum()) / float(counts.sum())
    assert record["training"]["draft_vocab_coverage"] == pytest.approx(covered, abs=1e-6)
    # the weights stay the stock model's: whole head, no map tensors, a plain config
    from transformers import AutoModelForCausalLM

    config = json.loads((folder / "config.json").read_text())
    assert "draft_vocab_size" not in config
    assert not {"d2t", "t2d"} & set(load_file(folder / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.get_output_embeddings().weight.shape[0] == vocab


def test_greedy_drafts_stay_inside_and_the_output_is_the_targets(
    trained, target_and_tokenizer, reference
):
    _, folder = trained
    model, tokenizer = target_and_tokenizer
    runtime = load_drafter(folder, model, tokenizer, from_name("chain", 3))
    head = runtime.module.get_output_embeddings()
    assert isinstance(head, DraftVocabHead)
    recording = RecordingProposer(runtime.make_proposer())
    generator = SpeculativeGenerator(model, tokenizer, recording, 3)
    params = SamplingParams(max_new_tokens=32)
    assert [generator.generate(p, params).token_ids for p in PROMPTS] == reference
    kept = _kept(folder)
    drafted = [t for tokens, _ in recording.proposals for t in tokens]
    assert drafted and set(drafted) <= set(kept)
    # the kept rows' logits are the whole head's; -inf off the map
    whole = head.head.lm_head
    states = torch.randn(5, whole.weight.shape[1])
    logits, full = head(states), whole(states)
    assert torch.allclose(logits[:, kept], full[:, kept], atol=1e-5)
    off = torch.ones(full.shape[-1], dtype=torch.bool)
    off[kept] = False
    assert bool(torch.isneginf(logits[:, off]).all())


def test_sampled_proposals_are_distributions_over_the_map(trained, target_and_tokenizer):
    _, folder = trained
    model, tokenizer = target_and_tokenizer
    runtime = load_drafter(folder, model, tokenizer, from_name("chain", 3))
    seen = []

    class Checking(RecordingProposer):
        def propose(self, context, max_tokens, params, generator):
            proposal = self.inner.propose(context, max_tokens, params, generator)
            if proposal.draft_probs is not None:
                seen.append((list(proposal.tokens), proposal.draft_probs))
            return proposal

    generator = SpeculativeGenerator(model, tokenizer, Checking(runtime.make_proposer()), 3)
    for prompt in PROMPTS[:2]:
        generator.generate(prompt, SamplingParams(max_new_tokens=24, temperature=1.0, seed=3))
    off = torch.ones(model.config.vocab_size, dtype=torch.bool)
    off[_kept(folder)] = False
    assert seen
    for tokens, q in seen:
        q = q.float()
        assert torch.allclose(q.sum(-1), torch.ones(len(q)), atol=1e-4)
        assert float(q[:, off].abs().max()) == 0.0
        assert bool((q[torch.arange(len(q)), torch.as_tensor(tokens)] > 0).all())


def test_the_map_is_part_of_the_checkpoint_and_a_broken_one_is_refused(
    trained, target_and_tokenizer, tmp_path
):
    _, folder = trained
    model, tokenizer = target_and_tokenizer
    copy = tmp_path / "broken"
    shutil.copytree(folder, copy)
    before = checkpoint_hash(copy)
    tensors = load_file(copy / DRAFT_VOCAB_FILE)
    tensors["d2t"] = tensors["d2t"].flip(0)  # no longer ascending target ids
    save_file(tensors, str(copy / DRAFT_VOCAB_FILE))
    assert checkpoint_hash(copy) != before
    broken = {
        "flipped": "d2t does not map draft ids",
        "other tensors": "holds d2t and t2d, not d2t",
        "not safetensors": "cannot be read",
    }
    for case, said in broken.items():
        if case == "other tensors":
            save_file({"d2t": tensors["d2t"]}, str(copy / DRAFT_VOCAB_FILE))
        if case == "not safetensors":
            (copy / DRAFT_VOCAB_FILE).write_bytes(b"not a map")
        with pytest.raises(DrafterError) as caught:
            load_drafter(copy, model, tokenizer, from_name("chain", 3))
        assert "\n" not in str(caught.value) and said in str(caught.value), case
    record = read_drafter_record(copy)
    (copy / "draftzoo.json").write_text(json.dumps({**record, "draft_vocab_file": "../x"}))
    with pytest.raises(DrafterError, match="draft_vocab_file must be"):
        defining_files(copy)
    (copy / "draftzoo.json").write_text(json.dumps(record))
    (copy / DRAFT_VOCAB_FILE).unlink()
    with pytest.raises(DrafterError, match=DRAFT_VOCAB_FILE):
        load_drafter(copy, model, tokenizer, from_name("chain", 3))


def test_the_card_says_what_it_drafts_over(trained):
    _, folder = trained
    record = read_drafter_record(folder)
    config = json.loads((folder / "config.json").read_text())
    note = " ".join(draft_vocabulary_note(config, record))
    assert f"it drafts over {SIZE:,} of the target's {config['vocab_size']:,} tokens" in note
    assert "its head truncated at export (the map beside it)" in note


def test_an_export_keeps_the_whole_head_and_says_so(trained, tmp_path):
    from draftzoo.architectures.export import describe_export, export_drafter

    _, folder = trained
    out = export_drafter(folder, tmp_path / "export", "hf")
    config = json.loads((out / "config.json").read_text())
    note = config["draftzoo"]["draft_vocabulary"]
    assert note.startswith(f"not carried: draftzoo drafts over {SIZE} of")
    assert "(its own head truncated)" in note and "draft over its own whole head" in note
    assert not (out / DRAFT_VOCAB_FILE).exists()
    assert any(line.startswith("draft vocabulary: not carried") for line in describe_export(out))
