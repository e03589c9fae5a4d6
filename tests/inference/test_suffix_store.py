"""The global suffix cache kept in a file: a later process drafts from what an earlier one
generated; every path it cannot use is refused in one line with nothing written."""

from __future__ import annotations

import json
import os

import pytest

from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.proposers.suffix import SuffixProposer
from draftzoo.inference.proposers.suffix_store import SuffixCacheFile, SuffixCacheFileError
from draftzoo.inference.sampling import SamplingParams
from tests.inference.helpers import PROMPTS


def test_a_later_process_drafts_from_the_file_an_earlier_one_wrote(
    target_and_tokenizer, reference, tmp_path
):
    model, tokenizer = target_and_tokenizer
    path = tmp_path / "suffix-cache.json"
    params = SamplingParams(max_new_tokens=32)

    def generator():  # a fresh process: the cache read back from the file
        cache = SuffixCacheFile(path, 32, 100_000, tokenizer)
        return SpeculativeGenerator(model, tokenizer, SuffixProposer(cache=cache), 8), cache

    first_run, empty = generator()
    assert empty.tokens == 0 and not path.exists()
    first = first_run.generate(PROMPTS[0], params)
    saved = json.loads(path.read_text())
    assert saved["outputs"] == [first.token_ids] and saved["depth"] == 32
    second_run, cache = generator()
    assert cache.tokens == len(first.token_ids)
    second = second_run.generate(PROMPTS[0], params)
    assert second.token_ids == first.token_ids == reference[0]
    assert second.metrics.num_target_forwards < first.metrics.num_target_forwards
    assert len(json.loads(path.read_text())["outputs"]) == 2
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind


def test_the_budget_holds_across_processes(target_and_tokenizer, tmp_path):
    _, tokenizer = target_and_tokenizer
    path = tmp_path / "cache.json"
    cache = SuffixCacheFile(path, 4, 10, tokenizer)
    for output in ([1, 2, 3, 4], [5, 6, 7], [8, 9, 1, 2]):
        cache.add(output)
    again = SuffixCacheFile(path, 4, 10, tokenizer)
    assert list(again.held) == [(5, 6, 7), (8, 9, 1, 2)] and again.tokens == 7


def test_paths_it_cannot_use_are_refused_and_left_alone(target_and_tokenizer, tmp_path, capsys):
    _, tokenizer = target_and_tokenizer
    mine = tmp_path / "notes.json"
    mine.write_text('{"todo": 1}')
    secret = tmp_path / "secret"
    secret.write_text("s")
    link = tmp_path / "link.json"
    os.symlink(secret, link)
    locked = tmp_path / "locked"
    locked.mkdir()
    cases = [
        (mine, "is not a draftzoo suffix cache"),
        (link, "symbolic link"),
        (tmp_path, "is not a file"),
        (tmp_path / "missing" / "c.json", "does not exist"),
    ]
    if os.geteuid() != 0:  # root writes anywhere
        locked.chmod(0o500)
        cases.append((locked / "c.json", "not writable"))
    for path, message in cases:
        with pytest.raises(SuffixCacheFileError, match=message):
            SuffixCacheFile(path, 32, 100, tokenizer)
    assert mine.read_text() == '{"todo": 1}' and secret.read_text() == "s"
    other = tmp_path / "other.json"
    SuffixCacheFile(other, 8, 100, tokenizer).add([1, 2, 3])
    with pytest.raises(SuffixCacheFileError, match="matches 8 tokens deep"):
        SuffixCacheFile(other, 32, 100, tokenizer)
    for token in (len(tokenizer), -1):  # ids the target cannot embed: refused, file kept
        data = json.loads(other.read_text())
        data["outputs"] = [[1, token]]
        other.write_text(json.dumps(data))
        with pytest.raises(SuffixCacheFileError, match="token ids outside the tokenizer's"):
            SuffixCacheFile(other, 8, 100, tokenizer)
        assert json.loads(other.read_text())["outputs"] == [[1, token]]
    from draftzoo.cli import main

    code = main(["generate", "--suffix", "--suffix-cache", str(mine), "--prompt", "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not a draftzoo suffix cache" in err[0]
    code = main(["generate", "--suffix-cache", str(other), "--prompt", "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [
        "draftzoo: error: draftzoo generate: --suffix-cache sets suffix decoding: add --suffix or "
        "--hybrid"
    ]
