"""Conversation rows: three formats, malformed rows counted (strict: refused), never dropped."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from draftzoo.data.conversations import (
    DataError,
    RowReport,
    iter_rows,
    iter_samples,
    normalise_row,
)
from draftzoo.data.token_dataset import DataConfig, build_token_dataset
from draftzoo.train.testbed import committed_testbed_dir

SHAREGPT = {
    "conversations": [
        {"from": "system", "value": "Be terse."},
        {"from": "human", "value": "Hi"},
        {"from": "gpt", "value": "Hello"},
    ]
}
MESSAGES = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}


def test_sharegpt_messages_and_text_rows_normalise():
    sample = normalise_row(SHAREGPT, 3)
    assert sample.row == 3
    assert [m["role"] for m in sample.messages] == ["system", "user", "assistant"]
    assert sample.messages[2]["content"] == "Hello"
    assert normalise_row(MESSAGES, 0).messages[1] == {"role": "assistant", "content": "Yo"}
    assert normalise_row({"text": "x = 1"}, 0).text == "x = 1"


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"messages": [{"role": "user", "content": "Hi"}]}, "no assistant turn"),
        ({"conversations": [{"from": "robot", "value": "beep"}]}, "unknown speaker"),
        ({"messages": [{"role": "user"}]}, "lacks 'role'/'content'"),
        ({"messages": "hello"}, "not a non-empty list"),
        ({"prompt": "x"}, "expected exactly one of"),
        ({"text": ""}, "missing or empty"),
        (["a", "list"], "not a mapping"),
    ],
)
def test_malformed_rows_say_why(row, reason):
    report = RowReport()
    assert list(iter_samples([row], "auto", strict=False, report=report)) == []
    assert report.rows == 1 and report.kept == 0
    assert any(reason in key for key in report.malformed), report.malformed
    with pytest.raises(DataError, match="malformed row 0"):
        list(iter_samples([row], "auto", strict=True, report=RowReport()))


def test_broken_jsonl_line_is_counted_not_lost(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(
        json.dumps(MESSAGES)
        + "\n{not json\n"
        + json.dumps({"messages": []})
        + "\n"
        + json.dumps(SHAREGPT)
        + "\n"
    )
    report = RowReport()
    kept = list(iter_samples(iter_rows(path), "auto", strict=False, report=report))
    assert [s.row for s in kept] == [0, 3]
    assert report.rows == 4 and report.kept == 2
    assert sum(report.malformed.values()) == 2
    assert "2 rejected" in report.summary()
    assert report.examples[0].startswith("row 1: invalid JSON")


def test_missing_local_file_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="not found"):
        list(iter_rows(str(tmp_path / "nope.jsonl")))


def test_token_dataset_reports_truncation_drops_and_caches(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(committed_testbed_dir())
    long_answer = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "word " * 200},
        ]
    }
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [MESSAGES, long_answer, {"bad": 1}]) + "\n")
    config = DataConfig(source=str(path), max_length=64, truncation="drop")
    dataset, report, key = build_token_dataset(config, tokenizer, tmp_path / "cache")
    assert len(dataset) == 1 and report.kept == 1 and report.rows == 3
    assert any("longer than max_length" in r for r in report.malformed)
    again, report_again, key_again = build_token_dataset(config, tokenizer, tmp_path / "cache")
    assert key_again == key and report_again.to_dict() == report.to_dict()
    assert again["input_ids"] == dataset["input_ids"]
    right = DataConfig(source=str(path), max_length=64, truncation="right")
    cut, _, other_key = build_token_dataset(right, tokenizer, tmp_path / "cache")
    assert other_key != key
    assert len(cut) == 2 and max(len(ids) for ids in cut["input_ids"]) == 64
    with pytest.raises(DataError, match="strict"):
        build_token_dataset(
            DataConfig(source=str(path), strict=True), tokenizer, tmp_path / "cache"
        )


def test_undecodable_and_over_nested_lines_are_malformed_rows_not_failures(tmp_path):
    from draftzoo.data.conversations import RowReport, iter_rows, iter_samples

    good = (
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
    )
    path = tmp_path / "rows.jsonl"
    with path.open("wb") as handle:
        handle.write((good + "\n").encode())
        handle.write(b'{"messages": "\xff\xfe"}\n')  # not UTF-8
        handle.write(("[" * 100_000 + "]" * 100_000 + "\n").encode())  # deeper than json parses
        handle.write((good + "\n").encode())
    report = RowReport()
    samples = list(iter_samples(iter_rows(path), "auto", False, report))
    assert len(samples) == 2 and report.rows == 4 and sum(report.malformed.values()) == 2
    assert any("nested too deeply" in reason for reason in report.malformed)
