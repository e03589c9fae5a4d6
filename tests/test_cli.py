import subprocess
import sys

import pytest

from draftzoo.cli import build_parser, main

SUBCOMMANDS = [
    [],
    ["testbed"],
    ["testbed", "build"],
    ["testbed", "info"],
    ["generate"],
    ["train"],
    ["capture"],
    ["regenerate"],
    ["eval"],
    ["publish"],
    ["zoo"],
    ["zoo", "list"],
    ["export"],
    ["demo"],
]


@pytest.mark.parametrize("words", SUBCOMMANDS)
def test_every_subcommand_has_help(words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*words, "--help"])
    assert exit_info.value.code == 0
    assert "usage: draftzoo" in capsys.readouterr().out


def test_console_script_runs():
    out = subprocess.run(["draftzoo", "--help"], capture_output=True, text=True, check=True)
    assert "testbed" in out.stdout


def test_unknown_size_fails_with_one_clear_message(capsys):
    assert main(["testbed", "build", "--size", "huge"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "draftzoo: error: unknown testbed size 'huge'; known sizes: tiny, small"


def test_info_on_a_folder_that_is_not_a_testbed(tmp_path, capsys):
    assert main(["testbed", "info", str(tmp_path)]) == 2
    assert "is not a built testbed (testbed.json missing)" in capsys.readouterr().err


def test_info_prints_size_and_heldout_loss(testbed_tiny, capsys):
    assert main(["testbed", "info", str(testbed_tiny[0])]) == 0
    out = capsys.readouterr().out
    assert "parameters:" in out and "held-out loss:" in out and "unigram" in out


def test_committed_small_testbed_info():
    out = subprocess.run(
        [sys.executable, "-m", "draftzoo.cli", "testbed", "info"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "testbed-small" in out and "held-out loss:" in out


def test_generate_prints_text_and_metrics(testbed_tiny, capsys):
    args = [
        "generate",
        "--target",
        str(testbed_tiny[0]),
        "--prompt-lookup",
        "--prompt",
        "def add(a, b):\n",
        "--max-new-tokens",
        "12",
        "--num-speculative-tokens",
        "3",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("def add(a, b):\n")
    assert "mean_acceptance_length:" in out and "num_draft_tokens:" in out


def test_generate_refuses_a_negative_temperature(testbed_tiny, capsys):
    args = ["generate", "--target", str(testbed_tiny[0]), "--prompt", "x", "--temperature", "-1"]
    assert main(args) == 2
    assert "temperature must be >= 0" in capsys.readouterr().err


def test_train_check_validates_the_real_pair_on_meta(capsys):
    from draftzoo.architectures.defaults import recipes_dir

    recipe = recipes_dir() / "draft_lm" / "llama-3.1-8b-instruct.yaml"
    assert main(["train", str(recipe), "--check"]) == 0
    out = capsys.readouterr().out
    assert "valid (checked on the meta device" in out and "8,030,261,248" in out
    assert main(["train", str(recipe), "--check", "--set", "train.lr=fast"]) == 2
    assert "train.lr: expected float" in capsys.readouterr().err


def test_every_smollm2_recipe_checks_on_meta_before_the_target_is_fetched(
    tmp_path, monkeypatch, capsys
):
    """Unfetched, a packaged target's recipes are checked against its hub model's shipped
    config (no hub, no download); every family has one."""
    from draftzoo.architectures.defaults import recipes_dir
    from draftzoo.architectures.families import family_specs

    monkeypatch.setenv("DRAFTZOO_CACHE", str(tmp_path / "empty"))
    recipes = sorted(recipes_dir().glob("*/smollm2-135m-instruct.yaml"))
    builtin = {spec.recipes_dir for spec in family_specs().values()}
    assert {path.parent.name for path in recipes} == builtin
    for recipe in recipes:
        assert main(["train", str(recipe), "--check"]) == 0, recipe
        out = capsys.readouterr().out
        assert "target_parameters: 134,515,008" in out and "target_layers: 30" in out


def test_capture_then_regenerate_writer_mismatch_are_cli_commands(testbed_tiny, tmp_path, capsys):
    from tests.train.helpers import recipe_yaml, tiny_recipe, write_chat_jsonl

    chat = write_chat_jsonl(tmp_path / "c.jsonl", 6)
    recipe = tiny_recipe(tmp_path, testbed_tiny[0], chat, data={"max_length": 512})
    path = recipe_yaml(recipe, tmp_path / "r.yaml")
    assert main(["capture", str(path), "--dir", str(tmp_path / "shards")]) == 0
    out = capsys.readouterr().out
    assert "disk estimate:" in out and "captured" in out
    from tests.conftest import tiny_causal_lm

    other = tmp_path / "other"
    tiny_causal_lm("llama").save_pretrained(other)
    from transformers import AutoTokenizer

    from draftzoo.train.testbed import committed_testbed_dir

    AutoTokenizer.from_pretrained(committed_testbed_dir()).save_pretrained(other)
    args = ["regenerate", str(path), "--output", str(tmp_path / "o.jsonl"), "--writer", str(other)]
    assert main(args) == 2
    assert "does not share the target's tokenizer" in capsys.readouterr().err


def test_publish_help_says_push_needs_the_network(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["publish", "--help"])
    assert "cannot run on an offline machine" in capsys.readouterr().out.replace("\n", " ")


def test_zoo_commands_fail_with_one_clear_message(tmp_path, capsys):
    assert main(["export", "no-such-drafter", "--format", "vllm", "--output-dir", "x"]) == 2
    assert "no drafter named 'no-such-drafter'" in capsys.readouterr().err
    assert main(["publish", str(tmp_path), "--zoo", str(tmp_path / "zoo")]) == 2
    assert "is not a draftzoo drafter" in capsys.readouterr().err


def test_zoo_list_prints_the_shipped_drafters(capsys):
    from draftzoo.architectures.zoo_index import builtin_zoo_dir

    assert main(["zoo", "list", "--zoo", str(builtin_zoo_dir())]) == 0
    out = capsys.readouterr().out
    from draftzoo.architectures.zoo_index import ZooIndex

    assert "eagle3-testbed-small" in out and "dflash-testbed-small" in out
    assert out.count("; certified") == len(ZooIndex(builtin_zoo_dir()).entries())


def test_export_says_what_it_wrote(tmp_path, capsys, monkeypatch):
    from draftzoo.train.testbed import committed_testbed_dir

    monkeypatch.chdir(tmp_path)
    args = ["export", "eagle3-testbed-small", "--format", "speculators", "--output-dir", "s"]
    assert main(args) == 0
    out = capsys.readouterr().out
    target = str(committed_testbed_dir().resolve())
    assert f"verifier: {target}" in out
    assert f"embed_tokens: the target's input embedding, from {target}" in out
    args = ["export", "eagle3-testbed-small", "--format", "sglang", "--output-dir", "g"]
    assert main([*args, "--verifier", "org/name"]) == 0
    assert "embed_tokens: not written" in capsys.readouterr().out
    assert main([*args, "--embed-tokens"]) == 0
    assert "embed_tokens: the target's input embedding" in capsys.readouterr().out
    assert (
        main(
            [
                "export",
                "eagle1-testbed-small",
                "--format",
                "vllm",
                "--output-dir",
                "e",
                "--embed-tokens",
            ]
        )
        == 2
    )
    assert "only EAGLE-3 exports carry the target's embedding" in capsys.readouterr().err
    assert not (tmp_path / "e").exists()


def test_every_family_export_format_is_a_cli_choice(tmp_path, monkeypatch):
    """What `--help` advertises the command takes: the Medusa reference layout from the CLI."""
    from safetensors.torch import load_file

    monkeypatch.chdir(tmp_path)
    args = ["export", "medusa1-testbed-small", "--format", "medusa", "--output-dir", "m"]
    assert main(args) == 0
    heads = load_file(tmp_path / "m" / "medusa_lm_head.safetensors")
    assert "0.0.linear.weight" in heads and "0.1.weight" in heads  # Medusa's own names
