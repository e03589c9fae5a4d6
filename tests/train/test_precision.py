"""`mixed_precision: auto`: bf16 autocast only where the hardware multiplies bf16 natively."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from draftzoo.architectures.drafter_io import read_drafter_record
from draftzoo.train import precision
from draftzoo.train.eagle import run
from draftzoo.train.recipe_config import TrainConfig
from draftzoo.train.testbed_config import PretrainConfig
from tests.train.helpers import tiny_eagle_recipe, write_chat_jsonl

CPU = torch.device("cpu")


def test_auto_is_bf16_only_where_bf16_is_native(monkeypatch):
    monkeypatch.setattr(precision, "native_bf16", lambda device: True)
    assert precision.resolve_mixed_precision("auto", CPU) == "bf16"
    monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    assert precision.resolve_mixed_precision("auto", CPU) == "no"


def test_explicit_choices_are_kept_and_slow_bf16_is_said(monkeypatch, caplog):
    monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    with caplog.at_level(logging.WARNING, logger=precision.__name__):
        assert precision.resolve_mixed_precision("bf16", CPU) == "bf16"
    assert "emulated" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=precision.__name__):
        assert precision.resolve_mixed_precision("no", CPU) == "no"
        assert precision.resolve_mixed_precision("fp16", CPU) == "fp16"
    assert caplog.text == ""
    with pytest.raises(ValueError, match="mixed_precision must be one of"):
        precision.resolve_mixed_precision("fp8", CPU)


def test_configs_accept_auto_and_reject_unknown_precisions():
    assert TrainConfig().mixed_precision == "auto"
    assert PretrainConfig().mixed_precision == "auto"
    with pytest.raises(ValueError, match="mixed_precision"):
        TrainConfig(mixed_precision="float32")
    with pytest.raises(ValueError, match="mixed_precision"):
        PretrainConfig(mixed_precision="fp16")


def test_a_run_with_auto_records_the_precision_it_trained_in(testbed_tiny, tmp_path):
    chat = write_chat_jsonl(tmp_path / "chat.jsonl", 16)
    recipe = tiny_eagle_recipe(
        tmp_path / "run",
        testbed_tiny[0],
        chat,
        eagle={"ttt_steps": 2},
        train={"mixed_precision": "auto", "checkpoint_every": 50},
    )
    run(recipe)
    record = read_drafter_record(Path(recipe.output_dir))
    assert record["recipe"]["train"]["mixed_precision"] == "auto"
    expected = "bf16" if precision.native_bf16(CPU) else "no"
    assert record["training"]["mixed_precision"] == expected
