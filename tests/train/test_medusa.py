"""Medusa-1 training on testbed-tiny: real steps, the loss checked by hand, both head targets,
per-head accuracies in the record, and a DDP run on two CPU processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from draftzoo.architectures.drafter_io import read_drafter_record
from draftzoo.architectures.medusa import MedusaConfig, build_medusa
from draftzoo.data.batching import collate
from draftzoo.data.capture import target_logits
from draftzoo.data.token_dataset import build_token_dataset
from draftzoo.train.medusa import run
from draftzoo.train.medusa_loss import MedusaLossConfig, medusa_loss_sums
from draftzoo.train.setup import load_target
from tests.train.helpers import (
    launch_two_processes,
    recipe_yaml,
    tiny_medusa_recipe,
    write_chat_jsonl,
)


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    return write_chat_jsonl(tmp_path_factory.mktemp("medusa") / "chat.jsonl", 24)


def test_loss_is_the_decayed_sum_of_each_heads_cross_entropy(testbed_tiny, chat, tmp_path):
    recipe = tiny_medusa_recipe(tmp_path, testbed_tiny[0], chat)
    target = load_target(recipe.target, "cpu")
    dataset, _, _ = build_token_dataset(recipe.data, target.tokenizer, tmp_path / "cache")
    batch = collate([dataset[i] for i in range(2)], target.tokenizer.pad_token_id or 0)
    torch.manual_seed(0)
    heads = build_medusa(MedusaConfig(num_heads=3), target)
    with torch.no_grad():
        for block in heads.blocks:
            block.layers[0].weight.normal_(0, 0.02)
        final = target(batch.input_ids, hidden_indices=[target.num_layers]).hidden_states[
            target.num_layers
        ]
    for kind in ("data", "distill"):
        config = MedusaLossConfig(target=kind, decay=0.5)
        total, stats = medusa_loss_sums(config, heads, target, final, batch)
        expected = 0.0
        for k in (1, 2, 3):  # by hand, one sequence position at a time
            terms = []
            for b, t in batch.loss_mask[:, k + 1 :].nonzero().tolist():
                same = batch.position_ids[b, t + k + 1] == batch.position_ids[b, t] + k + 1
                if not same:
                    continue
                logits = heads.head_logits(k - 1, final[b, t])
                if kind == "data":
                    terms.append(F.cross_entropy(logits, batch.input_ids[b, t + k + 1]))
                else:
                    p = F.softmax(target_logits(target, final[b, t + k]), -1)
                    terms.append(-(p * F.log_softmax(logits, -1)).sum())
            assert stats[f"head{k}_top1"][1] == len(terms)
            expected += 0.5 ** (k - 1) * torch.stack(terms).sum()
        torch.testing.assert_close(total, expected, rtol=1e-4, atol=1e-3)
        assert all(0 <= stats[f"head{k}_top1"][0] <= stats[f"head{k}_top5"][0] for k in (1, 2, 3))


def test_truncated_heads_learn_only_the_tokens_their_vocabulary_holds(testbed_tiny, chat, tmp_path):
    recipe = tiny_medusa_recipe(tmp_path, testbed_tiny[0], chat)
    target = load_target(recipe.target, "cpu")
    dataset, _, _ = build_token_dataset(recipe.data, target.tokenizer, tmp_path / "cache")
    batch = collate([dataset[i] for i in range(2)], target.tokenizer.pad_token_id or 0)
    token_map = batch.input_ids.unique()[::2]  # half the tokens the rows hold
    torch.manual_seed(0)
    heads = build_medusa(
        MedusaConfig(num_heads=2, draft_vocab_size=len(token_map)), target, token_map=token_map
    )
    final = (
        target(batch.input_ids, hidden_indices=[target.num_layers])
        .hidden_states[target.num_layers]
        .detach()
    )
    for kind in ("data", "distill"):
        total, stats = medusa_loss_sums(MedusaLossConfig(target=kind), heads, target, final, batch)
        expected, positions = 0.0, 0
        for k in (1, 2):
            for b, t in batch.loss_mask[:, k + 1 :].nonzero().tolist():
                if batch.position_ids[b, t + k + 1] != batch.position_ids[b, t] + k + 1:
                    continue
                positions += k == 1
                teacher = target_logits(target, final[b, t + k]).detach()
                token = int(batch.input_ids[b, t + k + 1] if kind == "data" else teacher.argmax())
                if token not in token_map.tolist():
                    continue  # the draft vocabulary cannot hold it: no loss
                logits = heads.draft_logits(k - 1, final[b, t])
                if kind == "data":
                    wanted = torch.tensor(token_map.tolist().index(token))
                    term = F.cross_entropy(logits, wanted)
                else:
                    p = F.softmax(teacher[token_map], -1)
                    term = -(p * F.log_softmax(logits, -1)).sum()
                expected = expected + 0.8 ** (k - 1) * term
        torch.testing.assert_close(total, expected, rtol=1e-4, atol=1e-3)
        assert stats["head1_top1"][1] == positions  # accuracy counts every position


def test_a_truncated_run_keeps_the_most_frequent_supervised_tokens(testbed_tiny, chat, tmp_path):
    from draftzoo.data.draft_vocab import count_supervised_tokens

    recipe = tiny_medusa_recipe(
        tmp_path,
        testbed_tiny[0],
        chat,
        medusa={"num_heads": 2, "draft_vocab_size": 32},
        train={"max_steps": 2},
    )
    assert run(recipe).final_loss > 0
    folder = Path(recipe.output_dir)
    training = read_drafter_record(folder)["training"]
    assert training["draft_vocab_size"] == 32 and 0 < training["draft_vocab_coverage"] < 1
    target = load_target(recipe.target, "cpu")
    dataset, _, _ = build_token_dataset(recipe.data, target.tokenizer, tmp_path / "cache2")
    counts = count_supervised_tokens(dataset, target.lm_head.weight.shape[0])
    from draftzoo.architectures.medusa import load_medusa

    kept = load_medusa(folder, target).token_map
    dropped = ~torch.isin(torch.arange(len(counts)), kept)
    assert int(counts[kept].min()) >= int(counts[dropped].max())


def test_a_run_trains_exports_and_records_per_head_accuracy(testbed_tiny, chat, tmp_path):
    recipe = tiny_medusa_recipe(tmp_path, testbed_tiny[0], chat, train={"max_steps": 4})
    result = run(recipe)
    assert 0 < result.final_loss < 50
    record = read_drafter_record(Path(recipe.output_dir))
    training = record["training"]
    assert len(training["head_top1_accuracy"]) == 3 == len(training["head_top5_accuracy"])
    top1, top5 = training["head_top1_accuracy"], training["head_top5_accuracy"]
    assert all(a <= b for a, b in zip(top1, top5, strict=True))
    assert record["family"] == "medusa1" and record["hidden_state_layers"] == [2]
    config = json.loads((Path(recipe.output_dir) / "config.json").read_text())
    assert config["medusa_num_heads"] == 3


def test_distill_target_trains_too(testbed_tiny, chat, tmp_path):
    recipe = tiny_medusa_recipe(
        tmp_path, testbed_tiny[0], chat, loss={"target": "distill"}, train={"max_steps": 2}
    )
    assert run(recipe).final_loss > 0


def test_ddp_ranks_train_medusa_heads_to_identical_weights(testbed_tiny, chat, tmp_path):
    recipe = tiny_medusa_recipe(
        tmp_path,
        testbed_tiny[0],
        chat,
        train={"max_steps": 3, "micro_batch_size": 2, "checkpoint_every": 10},
    )
    proc = launch_two_processes(recipe_yaml(recipe, tmp_path / "ddp.yaml"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    work = Path(f"{recipe.output_dir}.work")
    digests = json.loads((work / "replicas.json").read_text())["digests"]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert read_drafter_record(Path(recipe.output_dir))["training"]["num_processes"] == 2
