"""`draftzoo zoo build`: a recipe to a published entry in one command; a rerun redoes only
what changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from draftzoo.architectures.config_io import to_dict
from draftzoo.cli import main
from tests.test_cli_errors import _assert_one_error_line
from tests.train.helpers import tiny_eagle_recipe, write_chat_jsonl

MEASURE = ["--prompts", "1", "--max-new-tokens", "8", "--temperatures", "0"]
CERTIFY = ["--certificate-samples", "300", "--certificate-prompts", "1"]


@pytest.fixture
def build_argv(testbed_tiny, tmp_path) -> list[str]:
    chat = write_chat_jsonl(tmp_path / "chat.jsonl")
    steps = {"max_steps": 2, "checkpoint_every": 1}
    recipe = to_dict(tiny_eagle_recipe(tmp_path, testbed_tiny[0], chat, train=steps))
    recipe["name"] = "eagle3-tiny"
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    argv = ["zoo", "build", "--family", "eagle3", "--target", "testbed-tiny"]
    argv += ["--recipe", str(tmp_path / "recipe.yaml"), "--work", str(tmp_path / "builds")]
    return [*argv, "--zoo", str(tmp_path / "zoo"), "--allow-unreliable-timing", *MEASURE]


def _stages(capsys) -> dict[str, str]:
    out = capsys.readouterr().out
    return {line.split(":")[0].split("] ")[1]: line for line in out.splitlines() if "] " in line}


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_a_build_trains_measures_certifies_publishes_and_a_rerun_keeps_it(
    build_argv, tmp_path, capsys
):
    assert main([*build_argv, *CERTIFY]) == 0
    stages = _stages(capsys)
    assert list(stages) == ["train", "measure", "certify", "publish"]
    assert "kept" not in "".join(stages.values())
    zoo = tmp_path / "zoo"
    index = json.loads((zoo / "index.json").read_text())["drafters"]
    entry = zoo / "eagle3-tiny"
    report = json.loads((entry / "report.json").read_text())
    assert "eagle3-tiny" in index and report["certificate"]["passed"]
    assert report["config"]["max_prompts"] == 1 and (entry / "README.md").is_file()
    before = {**_files(tmp_path / "builds"), **_files(zoo)}

    assert main([*build_argv, *CERTIFY]) == 0  # nothing to do: every stage kept
    stages = _stages(capsys)
    assert all("kept" in line for line in stages.values()), "\n".join(stages.values())
    assert {**_files(tmp_path / "builds"), **_files(zoo)} == before

    # other measurement settings: the drafter kept, the rest redone, the entry replaced
    assert main([*build_argv, "--prompts", "2", *CERTIFY]) == 0
    stages = _stages(capsys)
    assert "kept" in stages["train"] and "kept" not in stages["measure"]
    assert "kept" not in stages["certify"] and "kept" not in stages["publish"]
    report = json.loads((entry / "report.json").read_text())
    assert report["config"]["max_prompts"] == 2 and report["certificate"]["passed"]


def test_a_target_the_family_has_no_recipe_for_is_refused_naming_those_it_has(capsys, tmp_path):
    argv = ["zoo", "build", "--family", "eagle3", "--target", "nope", "--work", str(tmp_path)]
    _assert_one_error_line(argv, capsys, "smollm2-135m-instruct")
    assert list(tmp_path.iterdir()) == []


def test_a_model_free_proposer_or_a_name_that_is_a_path_is_refused(build_argv, capsys, tmp_path):
    _assert_one_error_line([*build_argv, "--prompt-lookup"], capsys, "not a proposer")
    _assert_one_error_line([*build_argv, "--name", "../outside"], capsys, "zoo names")
    assert not (tmp_path / "builds").exists() and not (tmp_path / "outside").exists()
