"""Bad input on every subcommand: one line `draftzoo: error: ...`, exit 2, no traceback.

Each case is a real invocation of `draftzoo.cli.main` (the same function the console script
runs) with a malformed YAML, an unknown key, a missing file, or a drafter for another target.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from draftzoo.cli import main

MALFORMED = "family: eagle3\ntrain: [unclosed\n"


def _recipe(tmp_path: Path, text: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


def _assert_one_error_line(argv: list[str], capsys, *needles: str) -> str:
    """`main(argv)` exits 2 with one stderr line starting `draftzoo: error:`."""
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    error_lines = [line for line in lines if line.startswith("draftzoo: error: ")]
    assert len(error_lines) == 1, err
    assert "Traceback" not in err, err
    for needle in needles:
        assert needle in error_lines[0], (needle, error_lines[0])
    return error_lines[0]


RECIPE_COMMANDS = [
    ["train"],
    ["train", "--check"],
    ["capture", "--dir", "SHARDS"],
    ["regenerate", "--output", "OUT.jsonl"],
]


def _words(words: list[str], tmp_path: Path) -> list[str]:
    return [str(tmp_path / w) if w in ("SHARDS", "OUT.jsonl") else w for w in words]


@pytest.mark.parametrize("words", RECIPE_COMMANDS, ids=" ".join)
def test_recipe_commands_refuse_malformed_yaml(words, tmp_path, capsys):
    recipe = _recipe(tmp_path, MALFORMED)
    line = _assert_one_error_line(
        [words[0], recipe, *_words(words[1:], tmp_path)], capsys, "not valid YAML"
    )
    assert recipe in line


@pytest.mark.parametrize("words", RECIPE_COMMANDS, ids=" ".join)
def test_recipe_commands_refuse_an_unknown_key(words, tmp_path, capsys):
    recipe = _recipe(tmp_path, "family: eagle3\ntrain:\n  max_stepz: 3\n")
    _assert_one_error_line(
        [words[0], recipe, *_words(words[1:], tmp_path)], capsys, "unknown key(s) ['max_stepz']"
    )


@pytest.mark.parametrize("words", RECIPE_COMMANDS, ids=" ".join)
def test_recipe_commands_refuse_a_missing_recipe(words, tmp_path, capsys):
    missing = str(tmp_path / "nope.yaml")
    _assert_one_error_line(
        [words[0], missing, *_words(words[1:], tmp_path)], capsys, "recipe not found", missing
    )


def test_recipe_commands_refuse_a_malformed_override(tmp_path, capsys):
    recipe = _recipe(tmp_path, "family: eagle3\n")
    _assert_one_error_line(
        ["train", recipe, "--set", "train.max_steps=[1"], capsys, "not valid YAML"
    )


def test_testbed_build_refuses_bad_configs(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [x\n")
    _assert_one_error_line(["testbed", "build", "--config", str(bad)], capsys, "not valid YAML")
    bad.write_text("name: x\nmodle: {}\n")
    _assert_one_error_line(["testbed", "build", "--config", str(bad)], capsys, "['modle']")
    missing = str(tmp_path / "none.yaml")
    _assert_one_error_line(["testbed", "build", "--config", missing], capsys, "not found")


def test_file_arguments_that_do_not_exist(tmp_path, capsys):
    missing = str(tmp_path / "missing")
    out = str(tmp_path / "out")
    cases = [
        ["testbed", "info", missing],
        ["generate", "--target", missing, "--prompt", "x"],
        ["eval", missing],
        ["publish", missing, "--report", missing],
        ["export", missing, "--format", "vllm", "--output-dir", out],
    ]
    for argv in cases:
        _assert_one_error_line(argv, capsys, missing)  # each names the path it lacks
    assert not Path(out).exists()


def test_a_report_that_is_not_json(tiny_drafters, tmp_path, capsys):
    report = tmp_path / "report.json"
    report.write_text("{not json")
    argv = ["publish", str(tiny_drafters["eagle3"]), "--report", str(report)]
    _assert_one_error_line([*argv, "--zoo", str(tmp_path / "zoo")], capsys)
    assert not (tmp_path / "zoo").exists()


def test_a_drafter_for_another_target(tiny_drafters, tmp_path, capsys):
    drafter = str(tiny_drafters["eagle3"])  # trained for testbed-tiny
    exported = tmp_path / "exported"
    cases = [
        (["eval", drafter, "--target", "testbed-small", "--prompts", "1"], "!="),
        (["generate", "--eagle", drafter, "--prompt", "def f():"], "!="),  # committed target
        (
            [
                *["export", drafter, "--format", "vllm", "--target", "testbed-small"],
                *["--output-dir", str(exported)],
            ],
            "the target's",
        ),
        (["generate", "--draft", str(tiny_drafters["draft_lm"]), "--prompt", "x"], "vocabulary"),
    ]
    for argv, needle in cases:
        _assert_one_error_line(argv, capsys, needle)
    assert not exported.exists()


def test_verbose_shows_the_traceback(tmp_path):
    """-v is the way to a traceback; without it, one line (a real console-script run)."""
    recipe = _recipe(tmp_path, MALFORMED)
    quiet = subprocess.run(
        [sys.executable, "-m", "draftzoo", "train", recipe], capture_output=True, text=True
    )
    assert quiet.returncode == 2
    assert quiet.stderr.startswith("draftzoo: error: ")
    assert "Traceback" not in quiet.stderr
    loud = subprocess.run(
        [sys.executable, "-m", "draftzoo", "-v", "train", recipe], capture_output=True, text=True
    )
    assert loud.returncode != 0
    assert "Traceback" in loud.stderr and "ConfigError" in loud.stderr
