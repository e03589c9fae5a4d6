"""Bad input on every subcommand: one line `draftzoo: error: ...`, exit 2, no traceback,
nothing written, nothing lost.

Each case is a real invocation of `draftzoo.cli.main` (the same function the console script
runs): malformed or empty YAML, unknown keys, wrong types, missing files, truncated safetensors,
a drafter for another target, tokenizer, hidden size or context length, empty and too-long
prompts, invalid sampling parameters, a dataset whose every row is bad. Every refused case is
counted; the tally is printed at the end of the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from draftzoo.cli import main
from tests.suite_counts import BAD_INPUTS

MALFORMED = "family: eagle3\ntrain: [unclosed\n"


def _recipe(tmp_path: Path, text: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


def _assert_one_error_line(argv: list[str], capsys, *needles: str) -> str:
    """`main(argv)` exits 2 with one stderr line starting `draftzoo: error:` (counted)."""
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    error_lines = [line for line in lines if line.startswith("draftzoo: error: ")]
    assert len(error_lines) == 1, err
    assert "Traceback" not in err, err
    for needle in needles:
        assert needle in error_lines[0], (needle, error_lines[0])
    BAD_INPUTS[" ".join(argv[:2]) if argv[0] in ("testbed", "zoo") else argv[0]] += 1
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
        (["generate", "--drafter", drafter, "--target", "testbed-small", "--prompt", "x"], "!="),
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


def test_empty_yaml_and_wrong_types(tmp_path, capsys):
    out = tmp_path / "out"
    for words in RECIPE_COMMANDS:
        argv = [words[0], _recipe(tmp_path, ""), *_words(words[1:], tmp_path)]
        _assert_one_error_line(argv, capsys, "empty")
        recipe = _recipe(tmp_path, "family: eagle3\ntrain:\n  max_steps: ten\n")
        argv = [words[0], recipe, *_words(words[1:], tmp_path)]
        _assert_one_error_line(argv, capsys, "max_steps")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    _assert_one_error_line(
        ["testbed", "build", "--config", str(empty), "--output-dir", str(out)], capsys, "empty"
    )
    assert not out.exists() and not (tmp_path / "SHARDS").exists()


def _tiny_recipe_file(tmp_path: Path, target: Path, data: Path) -> str:
    from tests.train.helpers import recipe_yaml, tiny_recipe

    return str(recipe_yaml(tiny_recipe(tmp_path / "run", target, data), tmp_path / "tiny.yaml"))


def test_a_dataset_whose_every_row_is_bad(testbed_tiny, tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"messages": "not a list"}\n{"text": 3}\n[1, 2]\n')
    recipe = _tiny_recipe_file(tmp_path, testbed_tiny[0], data)
    for words in RECIPE_COMMANDS:
        if "--check" in words:  # checks the recipe on the meta device; reads no data
            continue
        _assert_one_error_line([words[0], recipe, *_words(words[1:], tmp_path)], capsys, "row")
    # the run's folders (the data cache aside) and the regenerated file are not left behind
    assert not (tmp_path / "run" / "drafter").exists()
    assert not (tmp_path / "run" / "drafter.work").exists()
    assert not (tmp_path / "OUT.jsonl").exists()
    assert not (tmp_path / "SHARDS").exists()


def test_regenerate_refuses_bad_sampling_before_writing(testbed_tiny, tmp_path, capsys):
    from tests.train.helpers import write_chat_jsonl

    recipe = _tiny_recipe_file(tmp_path, testbed_tiny[0], write_chat_jsonl(tmp_path / "c.jsonl", 4))
    out = tmp_path / "o.jsonl"
    out.write_text('{"kept": true}\n')  # a previous run's rows: nothing may be lost
    cases = [
        (["--temperature", "-1"], "temperature"),
        (["--temperature", "nan"], "temperature"),
        (["--temperature", "inf"], "temperature"),
        (["--top-p", "0"], "top_p"),
        (["--top-p", "1.5"], "top_p"),
        (["--top-p", "nan"], "top_p"),
        (["--max-new-tokens", "0"], "max_new_tokens"),
        (["--batch-size", "0"], "batch_size"),
        (["--seed", str(10**23)], "seed must be in [0, 2**62)"),
        (["--writer", str(tmp_path / "no-writer")], "no-writer"),
    ]
    for words, needle in cases:
        _assert_one_error_line(["regenerate", recipe, "--output", str(out), *words], capsys, needle)
    assert out.read_text() == '{"kept": true}\n'


def test_generate_refuses_bad_prompts_and_sampling(testbed_tiny, capsys):
    target = str(testbed_tiny[0])
    cases = [
        (["--prompt", ""], "empty"),
        (["--prompt", "x", "--temperature", "-1"], "temperature"),
        (["--prompt", "x", "--temperature", "nan"], "temperature"),
        (["--prompt", "x", "--temperature", "inf"], "temperature"),
        (["--prompt", "x", "--top-p", "0"], "top_p"),
        (["--prompt", "x", "--top-p", "nan"], "top_p"),
        (["--prompt", "x", "--top-p", "1.5"], "top_p"),
        (["--prompt", "x", "--top-k", "-1"], "top_k"),
        (["--prompt", "def f():\n" * 400], "context"),
        (["--prompt", "x", "--max-new-tokens", "0"], "max_new_tokens"),
    ]
    for words, needle in cases:
        _assert_one_error_line(["generate", "--target", target, *words], capsys, needle)


def _truncated(folder: Path, to: Path) -> str:
    import shutil

    shutil.copytree(folder, to)
    weights = to / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    return str(to)


def test_truncated_weights(tiny_drafters, testbed_tiny, tmp_path, capsys):
    broken = _truncated(tiny_drafters["eagle3"], tmp_path / "broken")
    out, zoo = tmp_path / "out", tmp_path / "zoo"
    report = tmp_path / "report.json"
    report.write_text("{}")
    cases = [
        ["generate", "--target", str(testbed_tiny[0]), "--drafter", broken, "--prompt", "x"],
        ["eval", broken, "--prompts", "1", "--output-dir", str(out)],
        ["export", broken, "--format", "vllm", "--output-dir", str(out)],
        ["publish", broken, "--report", str(report), "--zoo", str(zoo)],
    ]
    for argv in cases:
        _assert_one_error_line(argv, capsys, "model.safetensors")
    assert not out.exists() and not zoo.exists()


@pytest.fixture
def retokenized(testbed_tiny, tmp_path) -> Path:
    """testbed-tiny with one token added to its tokenizer: the same weights, another tokenizer."""
    import shutil

    from transformers import AutoTokenizer

    folder = tmp_path / "retokenized"
    shutil.copytree(testbed_tiny[0], folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(["<draftzoo-extra>"])
    tokenizer.save_pretrained(folder)
    return folder


def test_a_drafter_for_another_tokenizer_or_context_length(
    tiny_drafters, retokenized, testbed_tiny, tmp_path, capsys
):
    import json
    import shutil

    drafter = str(tiny_drafters["eagle3"])
    out = tmp_path / "out"
    cases = [
        ["eval", drafter, "--target", str(retokenized), "--prompts", "1", "--output-dir", str(out)],
        ["generate", "--target", str(retokenized), "--drafter", drafter, "--prompt", "x"],
    ]
    for argv in cases:
        _assert_one_error_line(argv, capsys, "tokenizer")
    longer = tmp_path / "longer"
    shutil.copytree(testbed_tiny[0], longer)
    config = json.loads((longer / "config.json").read_text())
    config["max_position_embeddings"] *= 2
    (longer / "config.json").write_text(json.dumps(config))
    argv = ["export", drafter, "--format", "vllm", "--target", str(longer)]
    _assert_one_error_line([*argv, "--output-dir", str(out)], capsys, "max_position_embeddings")
    assert not out.exists()


@pytest.fixture
def pickled_target(testbed_tiny, tmp_path) -> Path:
    """testbed-tiny with its weights as `pytorch_model.bin` (a pickle) instead of safetensors."""
    import shutil

    import torch
    from safetensors.torch import load_file

    folder = tmp_path / "pickled"
    shutil.copytree(testbed_tiny[0], folder)
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    return folder


def test_pickled_weights_are_refused_unless_allowed(pickled_target, testbed_tiny, tmp_path, capsys):
    from tests.train.helpers import write_chat_jsonl

    recipe = _tiny_recipe_file(tmp_path, pickled_target, write_chat_jsonl(tmp_path / "c.jsonl", 4))
    cases = [
        ["generate", "--target", str(pickled_target), "--prompt", "def f():"],
        [
            "generate",
            "--target",
            str(testbed_tiny[0]),
            "--draft",
            str(pickled_target),
            "--prompt",
            "x",
        ],
        *([w[0], recipe, *_words(w[1:], tmp_path)] for w in RECIPE_COMMANDS if "--check" not in w),
    ]
    for argv in cases:
        _assert_one_error_line(argv, capsys, "pytorch_model.bin", "--allow-pickle")
    assert not (tmp_path / "run" / "drafter.work").exists()
    assert not (tmp_path / "OUT.jsonl").exists() and not (tmp_path / "SHARDS").exists()
    # allowed explicitly, the same weights give the same greedy text
    argv = ["generate", "--prompt", "def f():", "--max-new-tokens", "8"]
    assert main(["--allow-pickle", *argv, "--target", str(pickled_target)]) == 0
    allowed = capsys.readouterr().out.split("\n---")[0]
    assert main([*argv, "--target", str(testbed_tiny[0])]) == 0
    assert capsys.readouterr().out.split("\n---")[0] == allowed


def test_an_export_refuses_a_proposal_length_no_engine_takes(tiny_drafters, tmp_path, capsys):
    out = tmp_path / "export"
    for length in ("0", "-1", "65"):
        argv = ["export", str(tiny_drafters["eagle3"]), "--format", "speculators"]
        argv += ["--output-dir", str(out), "--num-speculative-tokens", length]
        _assert_one_error_line(argv, capsys, "speculative_tokens must be in 1..64")
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_remote_code_is_never_trusted(testbed_tiny):
    from draftzoo.architectures.safe_load import UnsafeFileError, load_causal_lm

    with pytest.raises(UnsafeFileError, match="trust_remote_code"):
        load_causal_lm(testbed_tiny[0], trust_remote_code=True)


def test_an_output_folder_with_files_draftzoo_did_not_write_is_refused(
    tiny_drafters, testbed_tiny, tmp_path, capsys, monkeypatch
):
    """Outputs are replaced whole, so a folder holding the user's own files is refused before
    any work, and `.` (the working directory) with it."""
    from tests.train.helpers import recipe_yaml, tiny_recipe, write_chat_jsonl

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    chat = write_chat_jsonl(tmp_path / "c.jsonl", 4)
    recipe = tiny_recipe(tmp_path / "run", testbed_tiny[0], chat)
    recipe_file = recipe_yaml(recipe, tmp_path / "r.yaml")
    cases = [
        ["export", str(tiny_drafters["eagle3"]), "--format", "vllm", "--output-dir", str(mine)],
        ["train", str(recipe_file), "--set", f"output_dir={mine}"],
    ]
    for argv in cases:
        _assert_one_error_line(argv, capsys, "did not write")
    monkeypatch.chdir(mine)
    dot = ["export", str(tiny_drafters["eagle3"]), "--format", "vllm", "--output-dir", "."]
    _assert_one_error_line(dot, capsys, "did not write")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert (mine / "notes.txt").read_text() == "keep me"
    assert not (tmp_path / "run" / "drafter.work").exists()


def test_out_of_range_options_and_malformed_zoos_and_prompt_files(tmp_path, capsys):
    """Numbers out of range, device names, zoo indexes of the wrong shape or encoding, a
    prompt file too short to measure: one line each."""
    from draftzoo.architectures.defaults import recipes_dir

    recipe = str(recipes_dir() / "eagle3" / "testbed-small.yaml")
    shaped = tmp_path / "shaped"
    shaped.mkdir()
    (shaped / "index.json").write_text('{"version": 1, "drafters": [1, 2]}')
    encoded = tmp_path / "encoded"
    encoded.mkdir()
    (encoded / "index.json").write_bytes(b"\xff\xfe\x00")
    one = tmp_path / "one.jsonl"
    one.write_text('{"question_id": 1, "turns": ["hi"]}\n')
    binary, latin1, deep = tmp_path / "b.jsonl", tmp_path / "l.jsonl", tmp_path / "d.jsonl"
    binary.write_bytes(b"\x00\xff\xfe\x80abc\n")
    latin1.write_bytes('{"question_id": 1, "turns": ["caf\xe9"]}\n'.encode("latin-1"))
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    lookup = ["eval", "--prompt-lookup", "--prompts", "1", "--certificate-samples", "0"]
    turns = ["user-turns", "--target", "testbed-small", "--output", str(tmp_path / "t.jsonl")]
    cases = [
        (["zoo", "list", "--zoo", str(shaped)], "not an object of entries"),
        (["zoo", "list", "--zoo", str(encoded)], "not valid JSON"),
        ([*lookup, "--prompt-set", str(one)], "eval needs at least 2"),
        ([*lookup, "--threads", "-2"], "--threads must be >= 0"),
        ([*lookup, "--seed", "-5"], "seed must be in [0, 2**62)"),
        ([*lookup, "--device", "tpu"], "not a device name"),
        ([*turns, "--device", "tpu"], "not a device name"),
        (
            [
                "generate",
                "--prompt",
                "x",
                "--prompt-lookup",
                "--min-ngram",
                "5",
                "--max-ngram",
                "2",
            ],
            "1 <= min_ngram <= max_ngram",
        ),
        (["generate", "--prompt", "x", "--seed", str(10**23)], "seed must be in [0, 2**63)"),
        ([*turns, "--seed", str(10**23)], "seed must be in [0, 2**62)"),
        ([*lookup, "--prompt-set", str(binary)], "is not UTF-8 text"),
        ([*lookup, "--prompt-set", str(latin1)], "is not UTF-8 text"),
        ([*lookup, "--prompt-set", str(deep)], "maximum recursion depth"),
        ([*lookup, "--prompt-set", "hf:"], "hf: names no dataset"),
        (["generate", "--prompt", "x", "--tree-choices", "[[1e400]]"], "rank inf is not an"),
        (["generate", "--prompt", "x", "--tree-choices", "[[0.5]]"], "rank 0.5 is not an"),
        (["generate", "--prompt", "x", "--tree-choices", "[[true]]"], "rank True is not an"),
        (
            [
                "generate",
                "--prompt",
                "x",
                "--drafter",
                "eagle3-testbed-small",
                "--tree",
                "--tree-top-k",
                "100000",
            ],
            "tree top_k 100000 is over 256",
        ),
        (
            [
                "generate",
                "--prompt",
                "x",
                "--drafter",
                "medusa1-testbed-small",
                "--tree",
                "--tree-choices",
                "[[0, 0]]",
            ],
            "needs every path's parent; missing [(0,)]",
        ),
        (
            [
                "generate",
                "--prompt",
                "x",
                "--drafter",
                "medusa1-testbed-small",
                "--tree-choices",
                "[[0]]",
            ],
            "--tree-choices shapes a tree: also pass --tree",
        ),
        (
            ["eval", "eagle3-testbed-small", "--tree", "--tree-choices", "[[-1]]"],
            "index paths >= 0",
        ),
        (["train", recipe, "--check", "--set", "train.lr=.nan"], "lr must be a finite number"),
        (["train", recipe, "--check", "--set", "train.lr=-1"], "lr must be a finite number >= 0"),
    ]
    for argv, needle in cases:
        _assert_one_error_line(argv, capsys, needle)


def test_bad_capture_formats_and_loss_chunks(testbed_tiny, tmp_path, capsys):
    """A chunk of 0 rows and an unknown capture format, at every recipe command; shards whose
    tensors are not the format their index names, at training: one line each, nothing made."""
    from tests.train.helpers import recipe_yaml, tiny_recipe, write_chat_jsonl

    chat = write_chat_jsonl(tmp_path / "c.jsonl", 6)
    tiny = tiny_recipe(tmp_path / "run", testbed_tiny[0], chat, data={"max_length": 512})
    recipe = str(recipe_yaml(tiny, tmp_path / "tiny.yaml"))
    for words in RECIPE_COMMANDS:
        tail = _words(words[1:], tmp_path)
        chunk = ["--set", "train.loss_chunk_rows=0"]
        _assert_one_error_line([words[0], recipe, *tail, *chunk], capsys, "loss_chunk_rows")
        fmt = ["--set", "capture.dtype=int8"]
        _assert_one_error_line([words[0], recipe, *tail, *fmt], capsys, "capture.dtype")
    assert not (tmp_path / "SHARDS").exists() and not (tmp_path / "OUT.jsonl").exists()
    shards = tmp_path / "shards"
    assert main(["capture", recipe, "--dir", str(shards)]) == 0
    offline = ["--set", "capture.mode=offline", "--set", f"capture.dir={shards}"]
    fp8 = ["--set", "capture.dtype=float8_e4m3"]
    capsys.readouterr()
    _assert_one_error_line(["train", recipe, *offline, *fp8], capsys, "holds bfloat16 states")
    index = json.loads((shards / "index.json").read_text())
    (shards / "index.json").write_text(json.dumps({**index, "dtype": "float8_e4m3"}))
    _assert_one_error_line(["train", recipe, *offline, *fp8], capsys, "its index says float8_e4m3")
    assert not (tmp_path / "run" / "drafter").exists()


def test_a_target_with_its_own_code_or_an_unsafe_chat_template(tmp_path, capsys):
    """A target folder whose config names its own Python files is refused before any of them
    could be read; a chat template that reaches outside jinja2's sandbox or loops past its
    bounds is refused where it is rendered: one line each, nothing written."""
    import shutil

    from draftzoo.train.testbed import committed_testbed_dir

    out = tmp_path / "eval"
    ran = tmp_path / "ran"
    custom = tmp_path / "custom"
    shutil.copytree(committed_testbed_dir(), custom)
    config = json.loads((custom / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_x.XModel"}
    (custom / "config.json").write_text(json.dumps(config))
    (custom / "modeling_x.py").write_text(f"open({str(ran)!r}, 'w')\n")
    evaluate = ["eval", "--prompt-lookup", "--prompts", "2", "--max-new-tokens", "4"]
    evaluate += ["--temperatures", "0", "--certificate-samples", "0", "--output-dir", str(out)]
    _assert_one_error_line([*evaluate, "--target", str(custom)], capsys, "model's own code")
    _assert_one_error_line(
        ["generate", "--target", str(custom), "--prompt", "hi"], capsys, "model's own code"
    )
    for template, needle in (
        ("{{ ''.__class__.__mro__ }}", "unsafe"),
        ("{% for i in range(10**9) %}{{ i }}{% endfor %}", "MAX_RANGE"),
    ):
        evil = tmp_path / f"evil-{needle}"
        shutil.copytree(committed_testbed_dir(), evil)
        (evil / "chat_template.jinja").write_text(template)
        _assert_one_error_line([*evaluate, "--target", str(evil)], capsys, "chat template", needle)
    assert not ran.exists() and not out.exists()
