"""User turns sampled from a target's own chat template: distinct, counted by why turns were
dropped, resumable to the same file, refused over a file draftzoo did not write, and valid
rows for `regenerate`."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from draftzoo.cli import main
from draftzoo.data import user_turns
from draftzoo.data.conversations import RowReport, iter_rows, iter_samples
from draftzoo.data.errors import DataError
from draftzoo.data.user_turns import (
    SOURCE,
    UserTurnConfig,
    synthesize_user_turns,
    user_turn_prefix,
)
from draftzoo.inference.load import load_target
from tests.test_cli_errors import _assert_one_error_line


@pytest.fixture(scope="module")
def tiny(testbed_tiny):
    folder, _ = testbed_tiny
    model, tokenizer = load_target(str(folder))
    return folder, model, tokenizer


write_progress = user_turns._write_progress


def _config(count: int) -> UserTurnConfig:
    return UserTurnConfig(count=count, max_new_tokens=24, batch_size=8, min_words=1, seed=3)


def test_the_prefix_is_the_template_up_to_a_user_turn(tiny):
    _, _, tokenizer = tiny
    prefix = user_turn_prefix(tokenizer)
    whole = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert whole.startswith(prefix) and whole[len(prefix) :].startswith("hi")


def test_turns_are_distinct_counted_and_resume_to_the_same_file(tiny, tmp_path, monkeypatch):
    _, model, tokenizer = tiny
    whole = tmp_path / "whole.jsonl"
    report = synthesize_user_turns(model, tokenizer, whole, _config(6))
    rows = [json.loads(line) for line in whole.read_text().splitlines()]
    assert len(rows) == report.kept == 6
    turns = [row["messages"][0]["content"] for row in rows]
    assert len({" ".join(t.lower().split()) for t in turns}) == 6 and all(turns)
    assert all(row["source"] == SOURCE and row["messages"][1]["content"] == "" for row in rows)
    dropped = report.unfinished + report.too_short + report.duplicates
    assert report.drawn == report.kept + dropped <= report.batches * 8
    # killed after a later batch's rows were written but before its progress record: the
    # rerun drops those rows, redraws that batch with its own seed, and writes the same file
    part = tmp_path / "part.jsonl"
    calls = []

    def killed(progress, report, config, dtype):
        calls.append(report.kept)
        # a batch that wrote rows, after one that did (the first record, written before any
        # row, counts none)
        if len(calls) > 1 and calls[-1] > calls[-2] and max(calls[:-1]) > 0:
            raise KeyboardInterrupt
        write_progress(progress, report, config, dtype)

    monkeypatch.setattr(user_turns, "_write_progress", killed)
    with pytest.raises(KeyboardInterrupt):
        synthesize_user_turns(model, tokenizer, part, _config(6))
    monkeypatch.setattr(user_turns, "_write_progress", write_progress)
    recorded = json.loads(part.with_name("part.jsonl.progress.json").read_text())["report"]
    assert len(part.read_text().splitlines()) > recorded["kept"]  # the unrecorded batch's rows
    synthesize_user_turns(model, tokenizer, part, _config(6))
    assert part.read_bytes() == whole.read_bytes()
    # asking for more continues the file
    synthesize_user_turns(model, tokenizer, part, _config(8))
    assert part.read_bytes().startswith(whole.read_bytes())
    assert len(part.read_text().splitlines()) == 8
    # rows regenerate can answer
    samples = list(iter_samples(iter_rows(str(whole)), "auto", True, RowReport()))
    assert len(samples) == 6


def test_a_file_draftzoo_did_not_write_is_refused_untouched(tiny, tmp_path, capsys):
    folder, model, tokenizer = tiny
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"messages": [{"role": "user", "content": "mine"}]}\n')
    before = mine.read_bytes()
    with pytest.raises(DataError, match="not a user-turn file draftzoo wrote"):
        synthesize_user_turns(model, tokenizer, mine, _config(3))
    argv = ["user-turns", "--target", str(folder), "--output", str(mine), "--count", "2"]
    _assert_one_error_line(argv, capsys, "draftzoo wrote")
    argv = ["user-turns", "--target", str(folder), "--output", str(tmp_path / "x.jsonl")]
    _assert_one_error_line([*argv, "--temperature", "0"], capsys, "temperature")
    _assert_one_error_line([*argv, "--temperature", "nan"], capsys, "temperature")
    # a turn of at most 128 tokens holds at most 128 words: a run that can never finish
    _assert_one_error_line([*argv, "--min-words", "1000000"], capsys, "can never be met")
    from draftzoo.architectures.output_folders import output_lock

    with output_lock(tmp_path / "x.jsonl", "user-turns"):  # a run already writing it
        _assert_one_error_line(argv, capsys, "being written by another draftzoo user-turns")
    assert mine.read_bytes() == before and not (tmp_path / "x.jsonl").exists()


def test_the_command_samples_in_the_dtype_asked_and_records_it(tiny, tmp_path):
    folder, _, _ = tiny
    out = tmp_path / "turns.jsonl"
    argv = ["user-turns", "--target", str(folder), "--output", str(out), "--count", "3"]
    assert main([*argv, "--max-new-tokens", "24", "--min-words", "1", "--dtype", "bfloat16"]) == 0
    assert len(out.read_text().splitlines()) == 3
    record = json.loads(out.with_name("turns.jsonl.progress.json").read_text())
    assert record["dtype"] == "bfloat16" and record["report"]["kept"] == 3


def test_a_run_killed_before_its_first_rows_resumes_and_settings_cannot_mix(
    tiny, tmp_path, monkeypatch, capsys
):
    """Killed after the output is opened and before any row: the rerun resumes (the record is
    written first). A resume with another setting than the rows were sampled with is refused
    in one line; raising `count` is a resume."""
    _, model, tokenizer = tiny
    out = tmp_path / "turns.jsonl"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(user_turns, "_sample_batch", killed)
        with pytest.raises(KeyboardInterrupt):
            synthesize_user_turns(model, tokenizer, out, _config(2))
    assert out.exists() and out.read_text() == ""
    assert synthesize_user_turns(model, tokenizer, out, _config(2)).kept == 2
    with pytest.raises(DataError, match="sampled with min_words 1"):
        synthesize_user_turns(model, tokenizer, out, replace(_config(3), min_words=2))
    assert synthesize_user_turns(model, tokenizer, out, _config(3)).kept == 3
    assert len(out.read_text().splitlines()) == 3
