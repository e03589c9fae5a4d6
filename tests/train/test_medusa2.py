"""Medusa-2 on testbed-tiny: the joint loss against Medusa-1's, the ramp, a real run that
exports heads + a peft adapter + drift figures + a calibrated tree, checkpoints of the trained
tensors only with exact resume, and a DDP run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftzoo.architectures.drafter_io import read_drafter_record
from draftzoo.architectures.lora_adapter import LoraSpec, attach_lora
from draftzoo.architectures.medusa import MedusaConfig, build_medusa
from draftzoo.data.batching import collate
from draftzoo.data.token_dataset import build_token_dataset
from draftzoo.train.medusa2 import run
from draftzoo.train.medusa2_loss import Medusa2Loss, Medusa2LossConfig
from draftzoo.train.medusa2_model import AdaptedTargetHeads
from draftzoo.train.medusa_loss import MedusaLossConfig, medusa_loss_sums
from draftzoo.train.setup import load_target
from tests.train.helpers import (
    launch_two_processes,
    recipe_yaml,
    tiny_medusa2_recipe,
    write_chat_jsonl,
)


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    return write_chat_jsonl(tmp_path_factory.mktemp("medusa2") / "chat.jsonl", 24)


def test_heads_weight_ramps_in():
    sine = Medusa2LossConfig(heads_weight=0.2, heads_ramp="sine", ramp_steps=100)
    linear = Medusa2LossConfig(heads_weight=0.2, heads_ramp="linear", ramp_steps=100)
    assert sine.heads_weight_at(0) == 0 == linear.heads_weight_at(0)
    assert sine.heads_weight_at(50) == pytest.approx(0.2 * math.sin(math.pi / 4))
    assert linear.heads_weight_at(50) == pytest.approx(0.1)
    assert sine.heads_weight_at(100) == 0.2 == linear.heads_weight_at(500)
    assert Medusa2LossConfig(heads_ramp="constant").heads_weight_at(0) == 0.2


def test_untrained_adapter_gives_zero_kl_and_medusa1s_head_loss(testbed_tiny, chat, tmp_path):
    """With LoRA B = 0 the adapted target is the original: KL 0, and the heads' part equals
    Medusa-1's loss on the same states, scaled by the heads' weight."""
    recipe = tiny_medusa2_recipe(tmp_path, testbed_tiny[0], chat)
    target = load_target(recipe.target, "cpu")
    dataset, _, _ = build_token_dataset(recipe.data, target.tokenizer, tmp_path / "cache")
    batch = collate([dataset[i] for i in range(2)], target.tokenizer.pad_token_id or 0)
    torch.manual_seed(0)
    heads = build_medusa(MedusaConfig(num_heads=3), target, "medusa2")
    with torch.no_grad():
        for block in heads.blocks:
            block.layers[0].weight.normal_(0, 0.02)
    peft_model = attach_lora(target.model, LoraSpec(rank=4, alpha=8, dropout=0.0))
    model = AdaptedTargetHeads(target, peft_model, heads)
    config = Medusa2LossConfig(target="data", heads_ramp="constant", heads_weight=0.3, decay=0.5)
    loss = Medusa2Loss(config, model)
    total, stats = loss(model, batch, loss.teacher(batch))
    assert stats["kl"][0].abs() < 1e-4 and stats["kl"][1] > 0
    with torch.no_grad():
        final = target(batch.input_ids, hidden_indices=[target.num_layers]).hidden_states[2]
        medusa1, _ = medusa_loss_sums(MedusaLossConfig("data", 0.5), heads, target, final, batch)
    torch.testing.assert_close(total, 0.3 * medusa1 + stats["kl"][0], rtol=1e-4, atol=1e-3)
    total.backward()
    lora_grads = [p.grad for n, p in model.named_parameters() if "lora_A" in n]
    assert lora_grads and all(g is not None for g in lora_grads)


def test_a_run_exports_heads_adapter_drift_and_calibrated_tree(testbed_tiny, chat, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    recipe = tiny_medusa2_recipe(tmp_path, testbed_tiny[0], chat, train={"max_steps": 4})
    result = run(recipe)
    assert 0 < result.final_loss < 50
    folder = Path(recipe.output_dir)
    record = read_drafter_record(folder)
    training = record["training"]
    assert record["family"] == "medusa2"
    drift = training["target_drift"]
    assert set(drift) == {"heldout_loss_original", "heldout_loss_adapted", "kl_original_adapted"}
    assert drift["heldout_loss_original"] > 0 and drift["kl_original_adapted"] >= 0
    tree = training["calibrated_tree"]
    assert len(tree["choices"]) == 6 and max(len(p) for p in tree["choices"]) <= 3
    assert all(len(row) == 3 for row in training["heldout_rank_accuracy"])
    # the adapter is peft's own format, for the recorded base, and loads with peft
    adapter = json.loads((folder / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["base_model_name_or_path"] == str(testbed_tiny[0])
    # the modules adapted, each by its full name (never the suffixes peft shortens them to)
    weights = load_file(str(folder / "adapter" / "adapter_model.safetensors"))
    adapted = {k.split(".lora_")[0] for k in weights}
    assert {f"base_model.model.{m}" for m in adapter["target_modules"]} == adapted
    assert not (folder / "adapter" / "README.md").exists()
    base = AutoModelForCausalLM.from_pretrained(testbed_tiny[0])
    peft_model = PeftModel.from_pretrained(base, str(folder / "adapter"))
    trained_b = [p for n, p in peft_model.named_parameters() if "lora_B" in n]
    assert trained_b and any(p.abs().sum() > 0 for p in trained_b)  # B moved off zero
    heads = load_file(str(folder / "model.safetensors"))
    assert all(k.startswith(("blocks.", "lm_heads.")) for k in heads)
    # a checkpoint holds the trained tensors only: LoRA and heads, no base weight
    checkpoint = next((Path(f"{recipe.output_dir}.work") / "checkpoints").glob("step-*"))
    saved = load_file(str(checkpoint / "model.safetensors"))
    assert saved and all("lora_" in k or k.startswith("heads.") for k in saved)


def test_resume_continues_exactly(testbed_tiny, chat, tmp_path):
    """4 steps straight equal 2 steps, a stop, and a resumed run to 4 (LoRA and heads)."""
    straight = tiny_medusa2_recipe(tmp_path / "a", testbed_tiny[0], chat, train={"max_steps": 4})
    run(straight)
    halted = tiny_medusa2_recipe(
        tmp_path / "b", testbed_tiny[0], chat, train={"max_steps": 2, "checkpoint_every": 1}
    )
    run(halted)
    resumed = tiny_medusa2_recipe(tmp_path / "b", testbed_tiny[0], chat, train={"max_steps": 4})
    result = run(resumed)
    assert result.resumed_from == 1  # the last checkpoint before the final step
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a = load_file(str(Path(straight.output_dir) / name))
        b = load_file(str(Path(resumed.output_dir) / name))
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_ddp_ranks_train_adapter_and_heads_to_identical_weights(testbed_tiny, chat, tmp_path):
    recipe = tiny_medusa2_recipe(
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
    record = read_drafter_record(Path(recipe.output_dir))
    assert record["training"]["num_processes"] == 2
    assert (Path(recipe.output_dir) / "adapter" / "adapter_model.safetensors").is_file()


def test_offline_capture_is_refused(testbed_tiny, chat, tmp_path):
    with pytest.raises(ValueError, match="online"):
        tiny_medusa2_recipe(
            tmp_path, testbed_tiny[0], chat, capture={"mode": "offline", "dir": str(tmp_path)}
        )


def test_heads_start_from_medusa1_heads_of_the_same_shape(testbed_tiny, chat, tmp_path):
    from draftzoo.architectures.config_io import ConfigError
    from draftzoo.architectures.drafter_io import read_drafter_record
    from draftzoo.architectures.medusa import load_medusa
    from draftzoo.train.medusa import run as run_medusa1
    from draftzoo.train.medusa2 import _heads_stage, _initial_heads
    from tests.train.helpers import tiny_medusa_recipe

    stage1 = tiny_medusa_recipe(tmp_path / "m1", testbed_tiny[0], chat)
    run_medusa1(stage1)
    recipe = tiny_medusa2_recipe(tmp_path, testbed_tiny[0], chat, init_heads=stage1.output_dir)
    target = load_target(recipe.target, "cpu")
    started = _initial_heads(recipe, target)
    trained = load_medusa(Path(stage1.output_dir), target)
    for key, tensor in trained.state_dict().items():
        torch.testing.assert_close(started.state_dict()[key], tensor, rtol=0, atol=0)
    assert started.fields["draftzoo_family"] == "medusa2"
    # the heads-only stage stays on the Medusa-2 record: the drafter's whole training budget
    stage1_training = read_drafter_record(Path(stage1.output_dir))["training"]
    assert _heads_stage(stage1.output_dir)["heads_stage"] == {
        key: stage1_training[key]
        for key in ("steps", "supervised_tokens", "train_seconds", "num_processes")
    }
    assert _heads_stage(None) == {}
    fewer = tiny_medusa2_recipe(
        tmp_path, testbed_tiny[0], chat, init_heads=stage1.output_dir, medusa={"num_heads": 2}
    )
    with pytest.raises(ConfigError, match="3 heads"):
        _initial_heads(fewer, target)


def test_heads_over_a_draft_vocabulary_keep_it_through_the_joint_stage(
    testbed_tiny, chat, tmp_path
):
    """Truncated heads' `token_map` is a buffer, not a trained tensor: the drafter and its
    checkpoints must keep it all the same, and the drafter loads."""
    from draftzoo.architectures.medusa import load_medusa
    from draftzoo.train.medusa import run as run_medusa1
    from draftzoo.train.setup import work_dir_of
    from tests.train.helpers import tiny_medusa_recipe

    truncated = {"num_heads": 3, "draft_vocab_size": 40}
    stage1 = tiny_medusa_recipe(tmp_path / "m1", testbed_tiny[0], chat, medusa=truncated)
    run_medusa1(stage1)
    recipe = tiny_medusa2_recipe(
        tmp_path, testbed_tiny[0], chat, init_heads=stage1.output_dir, medusa=truncated
    )
    run(recipe)
    target = load_target(recipe.target, "cpu")
    heads = load_medusa(Path(recipe.output_dir), target)
    stage1_map = load_medusa(Path(stage1.output_dir), target).token_map
    assert heads.token_map is not None and heads.token_map.shape == (40,)
    assert torch.equal(heads.token_map, stage1_map)
    checkpoints = list((work_dir_of(recipe) / "checkpoints").glob("step-*"))
    assert checkpoints
    for checkpoint in checkpoints:
        saved = load_file(checkpoint / "model.safetensors")
        assert torch.equal(saved["heads.token_map"], stage1_map)
