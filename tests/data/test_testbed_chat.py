"""`draftzoo testbed export-chat`: the exported file tokenizes to `testbed-chat`'s rows."""

from __future__ import annotations

import json
from itertools import islice

from transformers import AutoTokenizer

from draftzoo.cli import main
from draftzoo.data.testbed_chat import TESTBED_CHAT, iter_testbed_chat_rows
from draftzoo.data.token_dataset import DataConfig, build_token_dataset
from draftzoo.train.testbed import committed_testbed_dir


def test_exported_conversations_tokenize_to_the_same_rows(tmp_path, capsys):
    out = tmp_path / "chat" / "testbed-chat.jsonl"
    assert main(["testbed", "export-chat", str(out), "--max-rows", "40"]) == 0
    assert "40 conversations of testbed-chat" in capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == list(islice(iter_testbed_chat_rows(), 40))
    assert not list(out.parent.glob("*.tmp"))
    assert main(["testbed", "export-chat", str(tmp_path / "none.jsonl"), "--max-rows", "0"]) == 2
    assert "max_rows must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "none.jsonl").exists()

    tokenizer = AutoTokenizer.from_pretrained(committed_testbed_dir())
    settings = {"max_length": 256, "packing": True, "max_samples": 40}
    built, _, key = build_token_dataset(
        DataConfig(source=TESTBED_CHAT, **settings), tokenizer, tmp_path / "a"
    )
    exported, _, exported_key = build_token_dataset(
        DataConfig(source=str(out), **settings), tokenizer, tmp_path / "b"
    )
    assert key != exported_key  # the key hashes the source, not only the rows
    columns = ("input_ids", "loss_mask", "lengths")
    assert len(built) == len(exported) > 0
    assert [[r[c] for c in columns] for r in built] == [[r[c] for c in columns] for r in exported]
