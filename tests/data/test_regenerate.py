"""Regeneration: the target's own greedy answers replace assistant turns; reruns resume."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from draftzoo.data.answer_report import answer_report
from draftzoo.data.conversations import DataError, RowReport, iter_rows, iter_samples
from draftzoo.data.regenerate import (
    RegenerateConfig,
    output_record,
    record_answer_report,
    regenerate,
)
from draftzoo.data.token_dataset import DataConfig
from draftzoo.train.recipe_config import TargetSpec
from draftzoo.train.setup import load_target
from tests.train.helpers import write_chat_jsonl


def test_regenerated_answers_are_the_targets_and_reruns_resume(testbed_tiny, tmp_path):
    source = write_chat_jsonl(tmp_path / "chat.jsonl", 6)
    with source.open("a") as handle:
        handle.write('{"messages": [{"role": "user", "content": "no answer"}]}\n')
    target = load_target(TargetSpec(path=str(testbed_tiny[0])), "cpu")
    data = DataConfig(source=str(source))
    out = tmp_path / "regen.jsonl"
    config = RegenerateConfig(max_new_tokens=12, batch_size=1, limit=3)
    written, report = regenerate(target, data, out, config)
    assert written == 3
    with out.open("a") as handle:
        handle.write('{"row": 3, "messa')  # a torn write from a killed run
    written, report = regenerate(
        target, data, out, RegenerateConfig(max_new_tokens=12, batch_size=4)
    )
    assert written == 3  # rows 3..5; the conversation without an answer is counted, not written
    assert sum(report.malformed.values()) == 1
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["row"] for r in rows] == [0, 1, 2, 3, 4, 5]
    original = [s.messages for s in iter_samples(iter_rows(source), "auto", False, RowReport())]
    tokenizer = target.tokenizer
    first = rows[0]["messages"]
    assert first[0] == original[0][0]  # the user turn is kept
    prompt = tokenizer.apply_chat_template(first[:1], tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        greedy = target.model.generate(ids, max_new_tokens=12, do_sample=False)
    expected = tokenizer.decode(greedy[0, ids.shape[1] :], skip_special_tokens=True).strip()
    assert first[1] == {"role": "assistant", "content": expected}
    # what was generated is recorded: tokens before the end token, and whether it came
    generated = greedy[0, ids.shape[1] :].tolist()
    ended = [i for i, t in enumerate(generated) if t == tokenizer.eos_token_id]
    length = {"tokens": ended[0] if ended else len(generated), "finished": bool(ended)}
    assert rows[0]["answers"] == [length]
    assert all(len(r["answers"]) == 1 for r in rows)
    # the output is itself a valid conversation source
    again = list(iter_samples(iter_rows(out), "auto", True, RowReport()))
    assert len(again) == 6


def test_strict_regeneration_stops_on_a_malformed_row(testbed_tiny, tmp_path):
    source = tmp_path / "bad.jsonl"
    source.write_text('{"messages": []}\n')
    target = load_target(TargetSpec(path=str(testbed_tiny[0])), "cpu")
    try:
        regenerate(
            target,
            DataConfig(source=str(source), strict=True),
            tmp_path / "o.jsonl",
            RegenerateConfig(max_new_tokens=4),
        )
    except DataError as err:
        assert "malformed row 0" in str(err)
    else:
        raise AssertionError("strict mode accepted a malformed row")


def test_a_writer_model_writes_the_answers_instead_of_the_target(testbed_tiny, tmp_path):
    source = write_chat_jsonl(tmp_path / "chat.jsonl", 2)
    target = load_target(TargetSpec(path=str(testbed_tiny[0])), "cpu")
    writer = type(target.model)(target.model.config).eval()  # same tokenizer, other weights
    torch.manual_seed(1)
    for param in writer.parameters():
        torch.nn.init.normal_(param, std=0.5)
    out = tmp_path / "regen.jsonl"
    config = RegenerateConfig(max_new_tokens=8, batch_size=2)
    regenerate(target, DataConfig(source=str(source)), out, config, writer=writer)
    first = json.loads(out.read_text().splitlines()[0])["messages"]
    tokenizer = target.tokenizer
    prompt = tokenizer.apply_chat_template(first[:1], tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]

    def greedy(model) -> str:
        with torch.no_grad():
            new = model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :]
        return tokenizer.decode(new, skip_special_tokens=True).strip()

    assert greedy(writer) != greedy(target.model)  # the check below can tell them apart
    assert first[1] == {"role": "assistant", "content": greedy(writer)}


def test_a_limit_stops_reading_the_source(testbed_tiny, tmp_path):
    source = write_chat_jsonl(tmp_path / "chat.jsonl", 2)
    with source.open("a") as handle:
        handle.write('{"messages": []}\n')  # strict mode would stop here, were it read
    target = load_target(TargetSpec(path=str(testbed_tiny[0])), "cpu")
    data = DataConfig(source=str(source), strict=True)
    config = RegenerateConfig(max_new_tokens=4, limit=2)
    written, report = regenerate(target, data, tmp_path / "o.jsonl", config)
    assert written == 2
    assert report.kept == 2


def test_batches_group_prompts_by_length_and_rows_keep_their_order(
    testbed_tiny, tmp_path, monkeypatch
):
    import draftzoo.data.regenerate as regen

    words = [9, 1, 7, 3, 5, 2]  # the user turn's length, row by row
    source = tmp_path / "chat.jsonl"
    with source.open("w") as handle:
        for n in words:
            user = {"role": "user", "content": "word " * n}
            turns = [user, {"role": "assistant", "content": "x"}]
            handle.write(json.dumps({"messages": turns}) + "\n")
    target = load_target(TargetSpec(path=str(testbed_tiny[0])), "cpu")
    calls: list[list[int]] = []
    encode = regen._encode

    def recording(tokenizer, contexts, device):
        calls.append([c[0]["content"].count("word") for c in contexts])
        return encode(tokenizer, contexts, device)

    monkeypatch.setattr(regen, "_encode", recording)
    for window, expected in ((3, [[1, 2], [3, 5], [7, 9]]), (1, [[1, 9], [3, 7], [2, 5]])):
        calls.clear()
        out = tmp_path / f"window-{window}.jsonl"
        config = RegenerateConfig(max_new_tokens=4, batch_size=2, sort_window=window)
        assert regenerate(target, DataConfig(source=str(source)), out, config)[0] == 6
        assert calls == expected  # window 1: batches of the source order
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["row"] for r in rows] == list(range(6))  # source order, whatever the batches
        assert [r["messages"][0]["content"].count("word") for r in rows] == words
    with pytest.raises(ValueError, match="sort_window"):
        RegenerateConfig(sort_window=0)


def test_answers_are_capped_to_the_room_the_writers_context_leaves(testbed_tiny, tmp_path):
    """A prompt near the writer's 512 positions gets only the room left (counted); one that
    fills the context gets an empty answer (counted); a short one is not capped."""
    target = load_target(TargetSpec(path=str(testbed_tiny[0])), "cpu")
    tokenizer = target.tokenizer
    limit = target.model.config.max_position_embeddings
    words = "def add(a, b): return a + b\n"

    def prompt_length(text: str) -> int:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])

    near = words
    while prompt_length(near + words) < limit - 10:
        near += words
    rows = [("short", "Say hi."), ("near", near), ("over", near + words * 8)]
    source = tmp_path / "long.jsonl"
    with source.open("w") as handle:
        for _, text in rows:
            messages = [{"role": "user", "content": text}, {"role": "assistant", "content": "x"}]
            handle.write(json.dumps({"messages": messages}) + "\n")
    out = tmp_path / "o.jsonl"
    config = RegenerateConfig(max_new_tokens=64, batch_size=1)
    written, report = regenerate(target, DataConfig(source=str(source)), out, config)
    assert written == 3 and report.capped == 2
    answers = [json.loads(line)["messages"][1]["content"] for line in out.read_text().splitlines()]
    room = limit - prompt_length(near)
    assert 0 < room < 64
    assert len(tokenizer(answers[1], add_special_tokens=False)["input_ids"]) <= room
    assert answers[2] == ""  # the prompt alone fills the context
    lengths = [json.loads(line)["answers"][0] for line in out.read_text().splitlines()]
    assert lengths[2] == {"tokens": 0, "finished": False} and lengths[1]["tokens"] <= room
    assert "capped" in report.to_dict() and RowReport.from_dict(report.to_dict()).capped == 2


def test_an_output_regenerate_did_not_write_is_refused_untouched(testbed_tiny, tmp_path):
    """The source itself, a user's file, another source's answers, a symlink and a damaged
    finished line: each refused in one error, every byte where it was."""
    import os

    from draftzoo.data.regenerate import output_record

    source = write_chat_jsonl(tmp_path / "chat.jsonl", 4)
    other = write_chat_jsonl(tmp_path / "other.jsonl", 4)
    target = load_target(TargetSpec(path=str(testbed_tiny[0])), "cpu")
    config = RegenerateConfig(max_new_tokens=4, batch_size=2, limit=2)
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    link = tmp_path / "link.jsonl"
    os.symlink(notes, link)
    before = {p: p.read_bytes() for p in (source, notes)}
    cases = [
        (source, "data source"),
        (notes, "did not write it"),
        (link, "not a regular file"),
        (tmp_path, "not a regular file"),
    ]
    for output, message in cases:
        with pytest.raises(DataError, match=message):
            regenerate(target, DataConfig(source=str(source)), output, config)
    assert {p: p.read_bytes() for p in before} == before
    assert not output_record(notes).exists() and not output_record(source).exists()
    assert not list(tmp_path.glob(".*.lock"))  # a refused run leaves no lock beside them
    out = tmp_path / "answers.jsonl"
    regenerate(target, DataConfig(source=str(source)), out, config)
    with pytest.raises(DataError, match="holds answers to"):
        regenerate(target, DataConfig(source=str(other)), out, config)
    lines = out.read_text().splitlines(keepends=True)
    damaged = "".join([lines[0][:10] + "\n", *lines[1:]])
    out.write_text(damaged)
    with pytest.raises(DataError, match=r"answers.jsonl:1: not a regenerated row"):
        regenerate(target, DataConfig(source=str(source)), out, replace(config, limit=None))
    assert out.read_text() == damaged  # the finished row after it is kept


def _row(row: int, request: str, answer: str, lengths: list[dict] | None) -> str:
    messages = [{"role": "user", "content": request}, {"role": "assistant", "content": answer}]
    record = {"row": row, "messages": messages}
    if lengths is not None:
        record["answers"] = lengths
    return json.dumps(record) + "\n"


def test_the_answer_report_counts_caps_refusals_empties_and_duplicates(tmp_path):
    done, capped = {"tokens": 7, "finished": True}, {"tokens": 384, "finished": False}
    path = tmp_path / "a.jsonl"
    path.write_text(
        _row(0, "Sort a list.", "Use sorted(xs).", [done])
        + _row(1, "sort  a LIST.", "I'm sorry, but as an AI I cannot sort.", [capped])
        + _row(2, "Write a poem.", "use SORTED(xs).", [done])  # a duplicate answer
        + _row(3, "Say nothing.", "", [{"tokens": 0, "finished": True}])
        + _row(4, "Older row.", "Written before lengths were recorded.", None)
        + json.dumps({"row": 5, "text": "plain text is not counted"})
        + "\n"
    )
    report = answer_report(path)
    assert (report.rows, report.answers, report.answer_tokens) == (5, 5, 7 + 384 + 7 + 0)
    assert (report.at_cap, report.unrecorded, report.empty, report.refusals) == (1, 1, 1, 1)
    assert (report.duplicate_answers, report.duplicate_requests) == (1, 1)
    assert "1 of 4 recorded answers stopped at the token cap" in report.summary()


def test_the_report_is_kept_in_the_record_and_a_rerun_still_resumes(testbed_tiny, tmp_path):
    source = write_chat_jsonl(tmp_path / "chat.jsonl", 4)
    target = load_target(TargetSpec(path=str(testbed_tiny[0])), "cpu")
    data = DataConfig(source=str(source))
    out = tmp_path / "regen.jsonl"
    config = RegenerateConfig(max_new_tokens=8, batch_size=2)
    regenerate(target, data, out, config)
    report = record_answer_report(out)
    assert report.rows == report.answers == 4 and report.unrecorded == 0
    assert 0 < report.answer_tokens <= 4 * 8
    record = json.loads(output_record(out).read_text())
    assert record["answers"] == report.to_dict() and record["written_by"] == "draftzoo regenerate"
    assert regenerate(target, data, out, config)[0] == 0  # the record still claims the file


def test_two_regenerations_of_one_output_cannot_interleave(testbed_tiny, tmp_path, capsys):
    """While one regenerate appends to an output (it holds the output's lock), a second on the
    same output is refused in one line and writes nothing; once the first ends, a rerun
    resumes."""
    from draftzoo.architectures.output_folders import output_lock
    from tests.test_cli_errors import _assert_one_error_line, _tiny_recipe_file

    source = write_chat_jsonl(tmp_path / "chat.jsonl", 4)
    recipe = _tiny_recipe_file(tmp_path, testbed_tiny[0], source)
    out = tmp_path / "answers.jsonl"
    argv = ["regenerate", recipe, "--output", str(out), "--max-new-tokens", "4", "--limit", "2"]
    with output_lock(out, "regenerate"):  # another process's run, as far as the lock goes
        _assert_one_error_line(argv, capsys, "being written by another draftzoo regenerate")
    assert not out.exists()
    from draftzoo.cli import main

    assert main(argv) == 0 and len(out.read_text().splitlines()) == 2


def test_a_resume_with_other_answer_settings_is_refused(testbed_tiny, tmp_path):
    """Rows sampled at one temperature (or cap, or by one writer) and resumed with another
    would mix two distributions in one file."""
    source = write_chat_jsonl(tmp_path / "chat.jsonl", 4)
    target = load_target(TargetSpec(path=str(testbed_tiny[0])), "cpu")
    out = tmp_path / "answers.jsonl"
    config = RegenerateConfig(max_new_tokens=4, batch_size=2, limit=2, temperature=1.0)
    regenerate(target, DataConfig(source=str(source)), out, config)
    before = out.read_bytes()
    for changed in ({"temperature": 0.5}, {"max_new_tokens": 5}, {"window": 64}):
        with pytest.raises(DataError, match="resume with those settings"):
            regenerate(target, DataConfig(source=str(source)), out, replace(config, **changed))
    assert out.read_bytes() == before
    written, _ = regenerate(
        target, DataConfig(source=str(source)), out, replace(config, limit=4, batch_size=4)
    )
    assert written == 2 and len(out.read_text().splitlines()) == 4


def test_only_what_the_training_window_reads_is_written(testbed_tiny, tmp_path):
    """With a window of W tokens (data.max_length, cut on the right) every written answer
    starts inside it and stops at its end, a later turn whose prompt fills it is dropped with
    the rest of its conversation (counted), a first answer is always written, the rows are a
    valid source, and the window is one of the settings a resume must repeat (a record from
    before windows resumes as whole conversations)."""
    target = load_target(TargetSpec(path=str(testbed_tiny[0])), "cpu")
    tokenizer = target.tokenizer
    source = tmp_path / "turns.jsonl"
    long_user = {"role": "user", "content": "def add(a, b): return a + b\n" * 12}
    with source.open("w") as handle:
        for turns in (1, 3, 4):
            messages = []
            for turn in range(turns):
                messages += [
                    {"role": "user", "content": f"Write function number {turn}."},
                    {"role": "assistant", "content": "x"},
                ]
            handle.write(json.dumps({"messages": messages}) + "\n")
        handle.write(json.dumps({"messages": [long_user, {"role": "assistant", "content": "x"}]}))

    def tokens(messages: list[dict], prompt: bool) -> int:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    window = 72
    assert tokens([long_user], True) >= window  # its first answer has no room: one token
    data = DataConfig(source=str(source))
    whole, windowed = tmp_path / "whole.jsonl", tmp_path / "windowed.jsonl"
    regenerate(target, data, whole, RegenerateConfig(max_new_tokens=24, batch_size=2))
    config = RegenerateConfig(max_new_tokens=24, batch_size=2, window=window)
    written, report = regenerate(target, data, windowed, config)
    rows = [json.loads(line) for line in windowed.read_text().splitlines()]
    everything = [json.loads(line) for line in whole.read_text().splitlines()]
    assert written == 4 and report.beyond_window > 0
    pairs = zip(everything, rows, strict=True)
    dropped = sum(len(a["answers"]) - len(b["answers"]) for a, b in pairs)
    assert dropped == report.beyond_window
    for row in rows:
        messages = row["messages"]
        assert messages[-1]["role"] == "assistant"
        assert len(row["answers"]) == sum(m["role"] == "assistant" for m in messages)
        for i, message in enumerate(messages):
            if message["role"] != "assistant" or i == 1:
                continue
            assert tokens(messages[:i], True) < window  # a later answer starts in the window
        start = tokens(messages[:-1], True)
        if start < window:  # the last answer stops where the window ends
            assert row["answers"][-1]["tokens"] <= window - start
    assert rows[-1]["answers"] == [{"tokens": 1, "finished": False}]
    assert len(list(iter_samples(iter_rows(windowed), "auto", True, RowReport()))) == 4
    assert RowReport.from_dict(report.to_dict()).beyond_window == report.beyond_window
    with pytest.raises(DataError, match="window 72"):
        regenerate(target, data, windowed, replace(config, window=None))
    record = output_record(whole)
    kept = json.loads(record.read_text())
    kept["settings"].pop("window")  # a record from before windows were kept
    record.write_text(json.dumps(kept))
    assert regenerate(target, data, whole, replace(config, window=None))[0] == 0


def test_ended_rows_leave_the_batch_and_the_answers_stay_the_same(testbed_tiny, tmp_path):
    """Decoding a few tokens a call, a row that has ended (or filled its room) leaves the
    batch between calls: the same greedy answers as one `generate` call for the whole batch,
    for fewer rows decoded."""
    target = load_target(TargetSpec(path=str(testbed_tiny[0])), "cpu")
    source = write_chat_jsonl(tmp_path / "chat.jsonl", 8)
    generate = target.model.generate
    rows_decoded: list[int] = []

    def counting(**inputs):
        out = generate(**inputs)
        rows_decoded.append(
            out.sequences.shape[0] * (out.sequences.shape[1] - inputs["input_ids"].shape[1])
        )
        return out

    target.model.generate = counting
    written, decoded = {}, {}
    for every in (0, 3):
        rows_decoded.clear()
        out = tmp_path / f"every-{every}.jsonl"
        config = RegenerateConfig(max_new_tokens=24, batch_size=4, shrink_every=every)
        regenerate(target, DataConfig(source=str(source)), out, config)
        written[every] = [json.loads(line) for line in out.read_text().splitlines()]
        decoded[every] = sum(rows_decoded)
    target.model.generate = generate
    assert written[3] == written[0]
    assert decoded[3] < decoded[0]
    with pytest.raises(DataError, match="shrink_every"):
        RegenerateConfig(shrink_every=-1)
