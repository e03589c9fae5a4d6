import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from draftzoo.train.testbed import TestbedError, load_testbed_config, read_record, recipe_path


def test_tiny_testbed_is_a_trained_llama(testbed_tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, record = testbed_tiny
    assert read_record(path) == json.loads((path / "testbed.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert next(model.parameters()).dtype == torch.bfloat16
    assert len(tokenizer) == model.config.vocab_size == 1024
    # it learned: clearly below the unigram baseline on held-out modules
    assert record["heldout_loss"] < 0.95 * record["unigram_loss"]
    assert record["training_tokens"] == 400 * 8 * 128
    assert record["corpus"]["heldout_files"] > 0 and record["corpus"]["chat_pairs"] > 0


def test_tiny_tokenizer_roundtrips_code_and_renders_the_chat_template(testbed_tiny):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(testbed_tiny[0])
    code = "def f(x):\n    return x ** 2  # ünïcode\n"
    assert tokenizer.decode(tokenizer(code).input_ids) == code
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "def g(): pass"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert (
        text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\ndef g(): pass<|im_end|>\n"
    )
    rendered = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = rendered["input_ids"], rendered["assistant_masks"]
    assert (
        tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
        == "def g(): pass<|im_end|>"
    )


def test_unknown_testbed_size_is_a_clear_error():
    with pytest.raises(TestbedError, match="unknown testbed size 'huge'; known sizes: tiny, small"):
        recipe_path("huge")


def _run_build(config_path, output, cache, env):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "draftzoo.cli",
            "testbed",
            "build",
            "--config",
            str(config_path),
            "--output-dir",
            str(output),
            "--cache-dir",
            str(cache),
            "--quality-tokens",
            "4",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_interrupted_build_resumes_to_the_same_weights(testbed_tiny, tmp_path):
    """Kill a build after its first checkpoint; the rerun must equal an uninterrupted run."""
    cache = testbed_tiny[0].parent / "cache"  # reuses the prepared tiny corpus
    recipe = recipe_path("tiny").read_text()
    env = {**os.environ, "WANDB_MODE": "offline"}
    results = {}
    for name in ("resume-straight", "resume-killed"):
        config_path = tmp_path / f"{name}.yaml"
        config_path.write_text(
            recipe.replace("name: testbed-tiny", f"name: {name}").replace(
                "checkpoint_every: 50", "checkpoint_every: 20"
            )
        )
        output = tmp_path / name
        if name == "resume-killed":
            proc = _run_build(config_path, output, cache, env)
            progress = cache / "runs" / name / "checkpoints" / "step-20" / "progress.json"
            deadline = time.monotonic() + 300
            while not progress.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
            assert not (output / "model.safetensors").exists()
        proc = _run_build(config_path, output, cache, env)
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
        if name == "resume-killed":
            assert "resumed from" in err
        results[name] = load_file(output / "model.safetensors")
    straight, resumed = results["resume-straight"], results["resume-killed"]
    assert straight.keys() == resumed.keys()
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key


def test_tiny_recipe_stays_under_a_million_training_tokens():
    config = load_testbed_config("tiny")
    assert config.train.max_steps * config.train.micro_batch_size * config.train.seq_len < 1e6
