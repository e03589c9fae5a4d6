"""Importing drafters in the peers' layouts: every export of the shipped drafters imports back
to the same tensors and config; a peer folder is converted on load (generate, eval, publish,
leaderboard); bad folders are refused in one line with nothing written. The peers' own
writers (speculators, SpecForge, the Medusa reference) are in tests/peers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftzoo.architectures.drafter_io import read_drafter_record
from draftzoo.architectures.export import export_for_target
from draftzoo.architectures.zoo_index import resolve_drafter
from draftzoo.cli import main
from draftzoo.inference.peer_import import import_drafter
from tests.test_cli_errors import _assert_one_error_line

TESTBED = "testbed-small"
#: every (shipped drafter, export format) whose layout draftzoo also imports
ROUND_TRIPS = [
    ("eagle3-testbed-small", "speculators"),
    ("eagle3-testbed-small", "sglang"),
    ("eagle3-testbed-small", "vllm"),
    ("eagle1-testbed-small", "vllm"),
    ("medusa1-testbed-small", "vllm"),
    ("medusa1-testbed-small", "medusa"),
    ("draft-lm-testbed-small", "hf"),
]


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("exports")
    return {
        (name, fmt): export_for_target(name, root / f"{name}-{fmt}", fmt)
        for name, fmt in ROUND_TRIPS
    }


@pytest.mark.parametrize("name,fmt", ROUND_TRIPS)
def test_every_export_imports_back_to_the_same_drafter(exports, tmp_path, name, fmt):
    shipped, _ = resolve_drafter(name)
    out = import_drafter(exports[name, fmt], tmp_path / "back", TESTBED)
    mine, back = load_file(shipped / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(back) == set(mine)
    for key, tensor in mine.items():
        assert back[key].dtype == tensor.dtype and torch.equal(back[key], tensor), key
    original = json.loads((shipped / "config.json").read_text())
    imported = json.loads((out / "config.json").read_text())
    if fmt != "hf":  # the draft LM's config is the model's own, as transformers wrote it
        assert imported == original
    record, shipped_record = read_drafter_record(out), read_drafter_record(shipped)
    assert record["family"] == shipped_record["family"]
    assert record["target"] == shipped_record["target"]
    assert record["hidden_state_layers"] == shipped_record["hidden_state_layers"]
    assert record["imported"]["sha256"] and record["imported"]["source"]


def test_a_peer_folder_is_converted_on_load_once(exports, tmp_path, monkeypatch):
    import draftzoo

    monkeypatch.setenv("DRAFTZOO_CACHE", str(tmp_path / "cache"))
    peer = exports["eagle3-testbed-small", "sglang"]
    generator = draftzoo.load(peer, target=TESTBED)
    converted = Path(generator.drafter.folder)
    assert converted.parent == tmp_path / "cache" / "imported"
    plain = draftzoo.load("eagle3-testbed-small")
    prompt = "def fibonacci(n):"
    assert generator.generate(prompt).token_ids == plain.generate(prompt).token_ids
    before = converted.stat().st_mtime_ns
    again = draftzoo.load(peer, target=TESTBED)
    assert Path(again.drafter.folder) == converted
    assert converted.stat().st_mtime_ns == before  # made once, reused


def test_an_imported_drafter_is_evaluated_published_and_ranked(exports, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTZOO_CACHE", str(tmp_path / "cache"))
    peer = exports["eagle3-testbed-small", "speculators"]  # names its verifier itself
    report, zoo = tmp_path / "eval", tmp_path / "zoo"
    assert main(["eval", str(peer), "--prompts", "1", "--max-new-tokens", "8",
                 "--certificate-samples", "30", "--output-dir", str(report)]) == 0  # fmt: skip
    argv = ["publish", str(peer), "--report", str(report / "report.json"), "--zoo", str(zoo)]
    assert main([*argv, "--allow-unreliable-timing", "--name", "e3-imported"]) == 0
    card = (zoo / "e3-imported" / "README.md").read_text()
    assert "## Origin" in card and "speculators Eagle3Speculator" in card
    assert "draftzoo import SOURCE --target" in card
    board = tmp_path / "board"
    assert main(["leaderboard", "--zoo", str(zoo), "--output-dir", str(board)]) == 0
    assert (
        "EAGLE-3 (imported: speculators Eagle3Speculator)" in (board / "LEADERBOARD.md").read_text()
    )


def _copy(folder: Path, to: Path, config=None, tensors=None, drop=(), pickle=False) -> Path:
    """A copy of export `folder` with its config changed, tensors replaced or dropped."""
    to.mkdir()
    fields = json.loads((folder / "config.json").read_text())
    (to / "config.json").write_text(json.dumps({**fields, **(config or {})}))
    weights = next(folder.glob("*.safetensors"))
    values = {k: v for k, v in load_file(weights).items() if k not in drop}
    values.update(tensors or {})
    if pickle:
        torch.save(values, to / "medusa_lm_head.pt")
    else:
        save_file(values, str(to / weights.name))
    return to


def _linked(folder: Path, to: Path, pattern: str) -> Path:
    """A copy of `folder` whose files matching `pattern` are links to copies outside it."""
    copy = _copy(folder, to)
    outside = to.parent / f"{to.name}-outside"
    outside.mkdir()
    for file in copy.glob(pattern):
        file.rename(outside / file.name)
        os.symlink(outside / file.name, file)
    return copy


def _bad_inputs(exports, tmp):
    speculators = exports["eagle3-testbed-small", "speculators"]
    sglang = exports["eagle3-testbed-small", "sglang"]
    medusa = exports["medusa1-testbed-small", "medusa"]
    embedding = load_file(speculators / "model.safetensors")["embed_tokens.weight"]
    fields = json.loads((speculators / "config.json").read_text())
    verifier = json.loads(json.dumps(fields["speculators_config"]))
    verifier["verifier"]["name_or_path"] = "meta-llama/Llama-3.1-8B-Instruct"
    layer = fields["transformer_layer_config"]
    return {
        "missing tensor": (
            _copy(sglang, tmp / "missing", drop=("norm.weight",)),
            [TESTBED],
            "missing ['norm.weight']",
        ),
        "wrong shape": (
            _copy(
                speculators,
                tmp / "shape",
                tensors={"layers.0.self_attn.q_proj.weight": torch.zeros(256, 300)},
            ),
            [TESTBED],
            "size mismatch",
        ),
        "another verifier": (
            _copy(speculators, tmp / "verifier", config={"speculators_config": verifier}),
            [TESTBED],
            "names verifier 'meta-llama/Llama-3.1-8B-Instruct', not the target",
        ),
        "pickle only": (
            _copy(medusa, tmp / "pickle", pickle=True),
            [TESTBED],
            "--allow-pickle",
        ),
        "speculators kind without a family": (
            _copy(speculators, tmp / "peagle", config={"speculators_model_type": "peagle"}),
            [TESTBED],
            "speculators_model_type 'peagle'",
        ),
        "unknown layout": (
            _copy(sglang, tmp / "unknown", drop=("fc.weight",), tensors={"x": torch.zeros(2)}),
            [TESTBED],
            "in no layout draftzoo imports",
        ),
        "another embedding": (
            _copy(speculators, tmp / "embedding", tensors={"embed_tokens.weight": embedding + 1}),
            [TESTBED],
            "embed_tokens is not the target's",
        ),
        "no target named": (_copy(sglang, tmp / "anonymous"), [], "pass --target"),
        "hidden size a string": (
            _copy(
                speculators,
                tmp / "hs",
                config={
                    "transformer_layer_config": {**layer, "hidden_size": str(layer["hidden_size"])}
                },
            ),
            [TESTBED],
            "expected int, got str",
        ),
        "zero heads": (
            _copy(
                speculators,
                tmp / "heads",
                config={"transformer_layer_config": {**layer, "num_attention_heads": 0}},
            ),
            [TESTBED],
            "ZeroDivisionError",
        ),
        "verifier a number": (
            _copy(
                speculators,
                tmp / "v5",
                config={"speculators_config": {**fields["speculators_config"], "verifier": 5}},
            ),
            [],
            "AttributeError",
        ),
        "linked weights": (
            _linked(sglang, tmp / "linked-weights", "*.safetensors"),
            [TESTBED],
            "is a symbolic link",
        ),
        "linked config": (
            _linked(sglang, tmp / "linked-config", "config.json"),
            [TESTBED],
            "is a symbolic link",
        ),
        "other norm order": (
            _copy(sglang, tmp / "norm", config={"norm_before_residual": True}),
            [TESTBED],
            "norm_before_residual is true",
        ),
    }


def test_bad_peer_folders_are_refused_in_one_line_writing_nothing(
    exports, tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("DRAFTZOO_ALLOW_PICKLE", raising=False)
    for case, (folder, target, said) in _bad_inputs(exports, tmp_path).items():
        before = sorted((p.name, p.stat().st_size) for p in folder.iterdir())
        out = tmp_path / f"out-{folder.name}"
        named = [x for t in target for x in ("--target", t)]
        argv = ["import", str(folder), "--output-dir", str(out), *named]
        line = _assert_one_error_line(argv, capsys, said, str(folder))
        assert ".tmp-" not in line, (case, line)  # names the user's folder, not a scratch one
        assert not out.exists(), case
        assert sorted((p.name, p.stat().st_size) for p in folder.iterdir()) == before, case
    # the pickle-only folder imports when pickles are allowed, to the shipped heads
    shipped, _ = resolve_drafter("medusa1-testbed-small")
    out = tmp_path / "allowed"
    pickled = tmp_path / "pickle"
    argv = ["--allow-pickle", "import", str(pickled), "--output-dir", str(out)]
    assert main([*argv, "--target", TESTBED]) == 0
    mine, back = load_file(shipped / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(back) == set(mine) and all(torch.equal(back[k], mine[k]) for k in mine)


@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_a_dflash_export_imports_back_to_the_same_drafter(tmp_path, fmt):
    """A seeded DFlash drafter for testbed-small (other shapes than the shipped one), both
    its layouts."""
    from draftzoo.architectures.defaults import committed_target_dir
    from draftzoo.architectures.dflash import DflashConfig, build_dflash
    from draftzoo.architectures.drafter_io import save_drafter
    from draftzoo.architectures.export import export_drafter
    from draftzoo.architectures.target import TargetAdapter

    target = TargetAdapter.from_pretrained(committed_target_dir())
    torch.manual_seed(0)
    drafter = build_dflash(DflashConfig(block_size=4, num_layers=2, mask_token_id=0), target)
    recipe = {"target": {"path": TESTBED}}
    taps = list(drafter.layers_read)
    folder = save_drafter(
        drafter, tmp_path / "d", "dflash", target.fingerprint(), recipe, "-", taps
    )
    exported = export_drafter(folder, tmp_path / fmt, fmt)
    out = import_drafter(exported, tmp_path / "back", TESTBED)
    mine, back = load_file(folder / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(back) == set(mine) and all(torch.equal(back[k], mine[k]) for k in mine)
    original = json.loads((folder / "config.json").read_text())
    assert json.loads((out / "config.json").read_text()) == original
    assert read_drafter_record(out)["hidden_state_layers"] == taps


def _speculators_mtp_folder(folder: Path, model_type: str = "llama", **replaced) -> Path:
    """The shipped MTP drafter in speculators' `MTPDraftModel` names and config (what its
    `save_pretrained` writes; speculators itself builds Qwen3-family layers only, so the test
    of its own writer is in tests/peers)."""
    from draftzoo.architectures.mtp_import import PIECES

    shipped, _ = resolve_drafter("mtp-testbed-small")
    ours = {value: key for key, value in PIECES.items()}
    tensors = {}
    for key, tensor in load_file(shipped / "model.safetensors").items():
        rest = key.removeprefix("layers.0.")
        piece, _, tail = rest.partition(".")
        name = f"{ours[piece]}.{tail}" if piece in ours else rest.removeprefix("mtp_block.")
        tensors[f"mtp_layers.0.{name}"] = tensor
    tensors.update(replaced)
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    config = {
        "speculators_model_type": "mtp",
        "architectures": ["MTPDraftModel"],
        "num_nextn_predict_layers": 1,
        "transformer_layer_config": {"model_type": model_type},
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_an_mtp_drafter_in_speculators_layout_imports_to_the_same_tensors(tmp_path, capsys):
    shipped, _ = resolve_drafter("mtp-testbed-small")
    out = import_drafter(_speculators_mtp_folder(tmp_path / "mtp"), tmp_path / "back", TESTBED)
    mine, back = load_file(shipped / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(back) == set(mine) and all(torch.equal(back[k], mine[k]) for k in mine)
    config = json.loads((out / "config.json").read_text())
    assert config["mtp_hand_over"] == "normed" and config["num_nextn_predict_layers"] == 1
    assert read_drafter_record(out)["imported"]["layout"] == "speculators MTPDraftModel"
    bad = {
        "qwen": (_speculators_mtp_folder(tmp_path / "qwen", "qwen3"), "a 'qwen3' layer"),
        "shape": (
            _speculators_mtp_folder(
                tmp_path / "shape", **{"mtp_layers.0.input_proj.weight": torch.zeros(256, 100)}
            ),
            "input_proj",
        ),
    }
    for folder, said in bad.values():
        argv = ["import", str(folder), "--output-dir", str(tmp_path / "x"), "--target", TESTBED]
        _assert_one_error_line(argv, capsys, said, str(folder))
        assert not (tmp_path / "x").exists()
