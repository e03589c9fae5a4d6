"""Medusa-2 served: the adapter merged into a fresh base target equals peft's unmerged model,
greedy speculative output equals the *adapted* target's (chain and calibrated tree, batch 1),
and the refusals: an adapter for another base, a second adapter on a merged target, a missing
adapter, a chain longer than the heads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from draftzoo.architectures.drafter_io import DrafterError
from draftzoo.architectures.lora_adapter import AdapterError, LoraSpec, attach_lora
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.load import load_drafter
from draftzoo.inference.proposal_settings import from_name
from draftzoo.inference.proposer import ProposerError
from draftzoo.inference.proposers.medusa import MedusaTree
from draftzoo.inference.sampling import SamplingParams
from tests.inference.helpers import PROMPTS
from tests.train.helpers import tiny_medusa2_recipe, write_chat_jsonl


@pytest.fixture(scope="module")
def medusa2_folder(testbed_tiny, tmp_path_factory) -> Path:
    """Heads and a LoRA trained jointly for 30 steps on testbed-tiny (real steps)."""
    from draftzoo.train.medusa2 import run

    root = tmp_path_factory.mktemp("medusa2-runtime")
    chat = write_chat_jsonl(root / "chat.jsonl", 48)
    recipe = tiny_medusa2_recipe(
        root,
        testbed_tiny[0],
        chat,
        loss={"ramp_steps": 5, "heads_weight": 1.0},
        train={"max_steps": 30, "lr": 5e-3, "warmup_steps": 2, "checkpoint_every": 100},
    )
    run(recipe)
    return Path(recipe.output_dir)


def _base(testbed_tiny):
    path = testbed_tiny[0]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


def test_merged_target_equals_peft_unmerged_and_differs_from_base(medusa2_folder, testbed_tiny):
    from peft import PeftModel

    base, tokenizer = _base(testbed_tiny)
    ids = tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    with torch.no_grad():
        original = base(ids).logits
        unmerged = PeftModel.from_pretrained(
            _base(testbed_tiny)[0], str(medusa2_folder / "adapter")
        )
        expected = unmerged(ids).logits
    runtime = load_drafter(medusa2_folder, base, tokenizer, from_name("chain", 3))
    with torch.no_grad():
        merged = base(ids).logits  # `base` now carries the merged adapter
    torch.testing.assert_close(merged, expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(merged, original)
    assert runtime.family == "medusa2"
    # loading again with the same adapter does not merge it twice
    load_drafter(medusa2_folder, base, tokenizer, from_name("chain", 3))
    with torch.no_grad():
        torch.testing.assert_close(base(ids).logits, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("proposal", ["chain", "tree"])
def test_greedy_output_equals_the_adapted_target(medusa2_folder, testbed_tiny, proposal):
    target, tokenizer = _base(testbed_tiny)
    runtime = load_drafter(medusa2_folder, target, tokenizer, from_name(proposal, 3))
    if proposal == "tree":  # the tree training calibrated on held-out rows
        record_tree = runtime.record["training"]["calibrated_tree"]["choices"]
        assert runtime.tree == MedusaTree(tuple(tuple(p) for p in record_tree))
    params = SamplingParams(max_new_tokens=32)
    adapted_only = SpeculativeGenerator(target, tokenizer)
    speculative = SpeculativeGenerator(
        target, tokenizer, runtime.make_proposer(), runtime.num_speculative_tokens
    )
    accepted = 0
    for prompt in PROMPTS:
        out = speculative.generate(prompt, params)
        assert out.token_ids == adapted_only.generate(prompt, params).token_ids
        accepted += out.metrics.num_accepted_tokens
    assert accepted > 0


def test_an_adapter_for_another_base_is_refused(medusa2_folder, testbed_tiny, tmp_path):
    folder = tmp_path / "swapped"
    shutil.copytree(medusa2_folder, folder)
    other = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=48,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    attach_lora(other, LoraSpec(rank=4)).save_pretrained(str(folder / "adapter"))
    target, tokenizer = _base(testbed_tiny)
    with pytest.raises(AdapterError, match="trained for another base"):
        load_drafter(folder, target, tokenizer, from_name("chain", 3))


def test_the_adapter_built_from_the_read_bytes_merges_as_peft_from_pretrained_does(
    medusa2_folder, testbed_tiny
):
    """The front door hands peft the bytes it read and hashed; the merged weights are bit for
    bit those of `PeftModel.from_pretrained(...).merge_and_unload()` on the folder."""
    from peft import PeftModel

    ours = _base(testbed_tiny)[0]
    load_drafter(medusa2_folder, ours, _base(testbed_tiny)[1], from_name("chain", 3))
    adapter = str(medusa2_folder / "adapter")
    theirs = PeftModel.from_pretrained(_base(testbed_tiny)[0], adapter).merge_and_unload()
    expected = theirs.state_dict()
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


def test_a_second_adapter_and_a_missing_adapter_are_refused(medusa2_folder, testbed_tiny, tmp_path):
    target, tokenizer = _base(testbed_tiny)
    load_drafter(medusa2_folder, target, tokenizer, from_name("chain", 3))
    other = tmp_path / "other"
    shutil.copytree(medusa2_folder, other)
    with pytest.raises(AdapterError, match="already has the adapter"):
        load_drafter(other, target, tokenizer, from_name("chain", 3))
    shutil.rmtree(other / "adapter")
    with pytest.raises(DrafterError, match=r"adapter/adapter_config\.json is missing"):
        load_drafter(other, _base(testbed_tiny)[0], tokenizer, from_name("chain", 3))


def test_a_chain_longer_than_the_heads_is_refused(medusa2_folder, testbed_tiny):
    target, tokenizer = _base(testbed_tiny)
    with pytest.raises(ProposerError, match="3 Medusa heads"):
        load_drafter(medusa2_folder, target, tokenizer, from_name("chain", 5))


@pytest.mark.parametrize("fmt", ["vllm", "medusa"])
def test_exports_carry_the_adapted_target(medusa2_folder, testbed_tiny, tmp_path, fmt):
    from draftzoo.architectures.export import export_drafter

    out = export_drafter(medusa2_folder, tmp_path / fmt, fmt, target=str(testbed_tiny[0]))
    heads_file = "model.safetensors" if fmt == "vllm" else "medusa_lm_head.safetensors"
    assert (out / heads_file).is_file()
    exported = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32).eval()
    merged, tokenizer = _base(testbed_tiny)
    load_drafter(medusa2_folder, merged, tokenizer, from_name("chain", 3))  # merges in place
    ids = tokenizer(PROMPTS[1], return_tensors="pt").input_ids
    with torch.no_grad():  # the export keeps the base's stored dtype (bf16): its rounding only
        torch.testing.assert_close(exported(ids).logits, merged(ids).logits, rtol=0, atol=2e-2)
