"""Medusa proposers in the runtime: greedy identity (chain and static tree, batch 1 and 4),
trees built from per-head rankings, and the refusals a tree or a drafter can meet."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import draftzoo
from draftzoo.inference.batch import BatchGenerator
from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.load import load_drafter
from draftzoo.inference.proposal_settings import from_name
from draftzoo.inference.proposer import ProposerError
from draftzoo.inference.proposers.eagle import TreeSettings
from draftzoo.inference.proposers.medusa import MedusaProposer, MedusaTree
from draftzoo.inference.sampling import SamplingParams
from tests.inference.helpers import PROMPTS, assert_reads_per_round
from tests.train.helpers import tiny_medusa_recipe, write_chat_jsonl

TREE = MedusaTree(((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1)))


@pytest.fixture(scope="module")
def heads_folder(testbed_tiny, tmp_path_factory) -> Path:
    """Medusa heads trained 40 steps on testbed-tiny (real steps)."""
    from draftzoo.train.medusa import run

    root = tmp_path_factory.mktemp("medusa-runtime")
    chat = write_chat_jsonl(root / "chat.jsonl", 48)
    recipe = tiny_medusa_recipe(
        root,
        testbed_tiny[0],
        chat,
        train={"max_steps": 40, "lr": 5e-3, "warmup_steps": 2, "checkpoint_every": 100},
    )
    run(recipe)
    return Path(recipe.output_dir)


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_greedy_output_equals_target_only_batch_1_and_4(
    heads_folder, target_and_tokenizer, reference, tree
):
    model, tokenizer = target_and_tokenizer
    proposer = MedusaProposer.from_pretrained(heads_folder, model, tokenizer, tree)
    single = SpeculativeGenerator(model, tokenizer, proposer, num_speculative_tokens=3)
    params = SamplingParams(max_new_tokens=32)
    outputs = [single.generate(p, params) for p in PROMPTS]
    assert [o.token_ids for o in outputs] == reference
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0  # the heads were used
    heads = proposer.heads
    batch = BatchGenerator(
        model,
        tokenizer,
        lambda: MedusaProposer(heads, proposer.target_layers[0], tree),
        num_speculative_tokens=3,
    )
    out = batch.generate(PROMPTS, params)
    assert [o.token_ids for o in out.outputs] == reference


def _truncated(heads_folder, model, tokenizer, path: Path) -> Path:
    """The trained heads cut to the half of the vocabulary they rank highest on average."""
    from draftzoo.architectures.drafter_io import read_drafter_record, save_drafter
    from draftzoo.architectures.medusa import MedusaHeads
    from draftzoo.architectures.target import TargetFingerprint

    heads = MedusaProposer.from_pretrained(heads_folder, model, tokenizer).heads
    vocab = heads.vocab_size
    token_map = heads.lm_heads[0].weight.norm(dim=-1).topk(vocab // 2).indices.sort().values
    fields = {**heads.fields, "truncated_vocab_size": vocab // 2}
    cut = MedusaHeads(fields)
    cut.set_token_map(token_map)
    with torch.no_grad():
        for source, target in zip(heads.lm_heads, cut.lm_heads, strict=True):
            target.weight.copy_(source.weight[token_map])
        for source, target in zip(heads.blocks, cut.blocks, strict=True):
            target.load_state_dict(source.state_dict())
    record = read_drafter_record(heads_folder)
    fingerprint = TargetFingerprint.from_dict(record["target"])
    layers = record["hidden_state_layers"]
    return save_drafter(cut, path, "medusa1", fingerprint, {}, "hash", layers=layers)


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_truncated_heads_keep_greedy_output_identical(
    heads_folder, target_and_tokenizer, reference, tree, tmp_path
):
    model, tokenizer = target_and_tokenizer
    folder = _truncated(heads_folder, model, tokenizer, tmp_path / "cut")
    proposer = MedusaProposer.from_pretrained(folder, model, tokenizer, tree)
    assert proposer.heads.token_map is not None
    generator = SpeculativeGenerator(model, tokenizer, proposer, num_speculative_tokens=3)
    outputs = [generator.generate(p, SamplingParams(max_new_tokens=32)) for p in PROMPTS]
    assert [o.token_ids for o in outputs] == reference
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_a_greedy_round_reads_the_host_once(heads_folder, target_and_tokenizer, reference, tree):
    """The heads' chain or tree stays on the device (gathered there from each head's
    ranking); the verification reads it with the target's argmax in one read per round. The
    heads run on the buffers a CUDA graph captures (eagerly off CUDA)."""
    model, tokenizer = target_and_tokenizer
    loaded = MedusaProposer.from_pretrained(heads_folder, model, tokenizer)
    proposer = MedusaProposer(
        loaded.heads, loaded.target_layers[0], tree, cache=CacheSettings(static=True)
    )
    proposer.use_graphs = True  # buffers without graphs off CUDA
    generator = SpeculativeGenerator(
        model, tokenizer, proposer, 3, cache=CacheSettings(static=True, max_length=256)
    )
    params = SamplingParams(max_new_tokens=32)
    assert_reads_per_round(generator, PROMPTS, reference, params)
    assert proposer._graphs


def test_the_tree_is_each_heads_ranking_under_its_parent():
    ranked = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
    cells, parents = TREE.layout(3, width=3)
    assert ranked.reshape(-1)[cells].tolist() == [10, 11, 20, 21, 20, 30, 31]
    assert parents == [-1, -1, 0, 0, 1, 2, 2]
    cells, parents = TREE.layout(1, width=3)
    assert ranked.reshape(-1)[cells].tolist() == [10, 11] and parents == [-1, -1]
    assert (TREE.depth, TREE.top_k) == (3, 2)


def test_bad_trees_and_settings_are_refused(heads_folder, target_and_tokenizer):
    with pytest.raises(ValueError, match="parent"):
        MedusaTree(((0,), (1, 0)))
    with pytest.raises(ValueError, match="twice"):
        MedusaTree(((0,), (0,)))
    model, tokenizer = target_and_tokenizer
    deep = MedusaTree(((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)))  # 4 deep, 3 heads
    with pytest.raises(ProposerError, match="3 heads"):
        MedusaProposer.from_pretrained(heads_folder, model, tokenizer, deep)
    with pytest.raises(ProposerError, match=r"trees of kind PositionTree \(--tree-choices\)"):
        load_drafter(heads_folder, model, tokenizer, from_name("tree", tree=TreeSettings(top_k=2)))


def test_load_serves_chains_and_the_default_tree(heads_folder, target_and_tokenizer, reference):
    model, tokenizer = target_and_tokenizer
    runtime = load_drafter(heads_folder, model, tokenizer, from_name("tree", tree=TREE))
    assert runtime.tree == TREE and runtime.num_speculative_tokens == TREE.depth
    generator = draftzoo.load(heads_folder, model, tokenizer, proposal="tree")
    assert generator.speculation == 3  # the default tree, cut to the 3 heads
    out = generator.generate(PROMPTS[0], SamplingParams(max_new_tokens=32))
    assert out.token_ids == reference[0]


def test_the_cli_generates_with_medusa_and_refuses_eagle_tree_options(
    heads_folder, testbed_tiny, capsys
):
    from draftzoo.cli import main

    base = ["generate", "--target", str(testbed_tiny[0]), "--drafter", str(heads_folder)]
    assert main([*base, "--tree", "--prompt", "def f(x):", "--max-new-tokens", "8"]) == 0
    assert "num_target_forwards" in capsys.readouterr().out
    assert main([*base, "--tree", "--tree-top-k", "3", "--prompt", "x"]) == 2
    assert "drafts trees of kind PositionTree (--tree-choices)" in capsys.readouterr().err
