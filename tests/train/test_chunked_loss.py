"""Vocabulary projections a chunk of rows at a time: the unchunked values and gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftzoo.train.chunked_loss import rowwise
from draftzoo.train.recipe_config import TrainConfig
from draftzoo.train.registry import run_recipe
from tests.train import helpers


def test_rowwise_gives_the_unchunked_values_and_gradients():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50)
    teacher = torch.nn.Linear(16, 50)
    hidden = torch.randn(37, 16, requires_grad=True)
    final = torch.randn(37, 16)

    def rows(h, f):
        log_q = torch.log_softmax(head(h), -1)
        with torch.no_grad():
            p = torch.softmax(teacher(f), -1)
        return -(p * log_q).sum(-1), log_q.argmax(-1) == p.argmax(-1)

    results = {}
    for chunk in (None, 5, 37, 100):
        head.zero_grad()
        hidden.grad = None
        loss, hits = rowwise(rows, (hidden, final), chunk)
        loss.sum().backward()
        results[chunk] = (loss.detach(), hits, hidden.grad.clone(), head.weight.grad.clone())
    for chunk in (5, 37, 100):
        for got, want in zip(results[chunk], results[None], strict=True):
            if got.dtype == torch.bool:
                assert torch.equal(got, want)
            else:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # no gradient: plain chunks, no checkpointing
        loss, _ = rowwise(rows, (hidden, final), 5)
    torch.testing.assert_close(loss, results[None][0], rtol=1e-5, atol=1e-6)


FAMILIES = {
    "draft_lm": helpers.tiny_recipe,
    "eagle1": lambda *a: helpers.tiny_eagle_recipe(*a, eagle={"kind": "eagle1"}),
    "eagle3": helpers.tiny_eagle_recipe,
    "medusa1": helpers.tiny_medusa_recipe,
    "medusa2": helpers.tiny_medusa2_recipe,
    "mtp": lambda *a: helpers.tiny_mtp_recipe(*a, mtp={"depth": 2}),
    "dflash": helpers.tiny_dflash_recipe,
}


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    return helpers.write_chat_jsonl(tmp_path_factory.mktemp("chat") / "chat.jsonl", 24)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_trains_the_same_with_its_loss_in_chunks(family, testbed_tiny, chat, tmp_path):
    """Two steps with the vocabulary projection in chunks of 7 rows and in one piece: the
    same losses and the same weights (up to float rounding of differently ordered sums)."""
    from dataclasses import replace

    runs = {}
    for chunk in (None, 7):
        recipe = FAMILIES[family](tmp_path / str(chunk), testbed_tiny[0], chat)
        recipe = replace(recipe, train=replace(recipe.train, loss_chunk_rows=chunk))
        result = run_recipe(recipe)
        runs[chunk] = (result.final_loss, load_file(Path(recipe.output_dir) / "model.safetensors"))
    (loss, weights), (chunked_loss, chunked) = runs[None], runs[7]
    assert chunked_loss == pytest.approx(loss, rel=1e-5)
    assert weights.keys() == chunked.keys()
    # bf16 on disk; Adam's first steps move a weight by about lr whatever its gradient's size,
    # so an entry whose gradient is ~0 may move either way: at most 2 x lr per step, and rare
    steps, lr = recipe.train.max_steps, recipe.train.lr
    for name, tensor in weights.items():
        gap = (chunked[name].float() - tensor.float()).abs()
        assert gap.max() <= 2 * lr * steps + 1e-3, name
        loose = gap > 1e-2 * tensor.float().abs() + 1e-3
        assert loose.float().mean() < 1e-3, name


def test_a_chunk_of_zero_rows_is_refused():
    with pytest.raises(ValueError, match="loss_chunk_rows must be >= 1"):
        TrainConfig(loss_chunk_rows=0)
    assert TrainConfig(loss_chunk_rows=None).loss_chunk_rows is None


def test_zero3_over_two_processes_trains_with_the_loss_in_chunks(testbed_tiny, chat, tmp_path):
    """DeepSpeed ZeRO-3 gathers the head's weights at every call: ranks whose micro-batches
    hold different numbers of rows still make the same calls, and the run exits cleanly."""
    from draftzoo.architectures.drafter_io import read_drafter_record
    from draftzoo.architectures.eagle import load_eagle
    from draftzoo.train.setup import load_target

    train = {"max_steps": 3, "loss_chunk_rows": 16, "micro_batch_size": 2}
    recipe = helpers.tiny_eagle_recipe(
        tmp_path, testbed_tiny[0], chat, train=train, data={"max_length": 256}
    )
    path = helpers.recipe_yaml(recipe, tmp_path / "zero3.yaml")
    proc = helpers.launch_two_processes(path, "deepspeed-zero3.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    training = read_drafter_record(Path(recipe.output_dir))["training"]
    assert training["steps"] == 3 and training["num_processes"] == 2
    assert "DEEPSPEED" in training["distributed_type"]
    load_eagle(Path(recipe.output_dir), load_target(recipe.target, "cpu"))
