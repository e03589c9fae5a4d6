"""Drafter folders whose files build no module (a wrong-shape tensor, absurd or missing config
values, a record or config that is not an object, an out-of-range d2t): one line, exit 2."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file


def _config(key, value):
    def mutate(folder):
        config = json.loads((folder / "config.json").read_text())
        config[key] = value
        (folder / "config.json").write_text(json.dumps(config))

    return mutate


def _tensors(change):
    def mutate(folder):
        tensors = load_file(str(folder / "model.safetensors"))
        change(tensors)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})

    return mutate


def _narrower(tensors):
    name = sorted(k for k in tensors if tensors[k].dim() == 2)[0]
    tensors[name] = tensors[name][:, :-1].contiguous()


CASES = {
    "wrong-shape": _tensors(_narrower),
    "negative-size": _config("hidden_size", -4),
    "unknown-activation": _config("hidden_act", "nope"),
    "unknown-rope": _config("rope_scaling", {"rope_type": "weird", "factor": 2.0}),
    "config-not-an-object": lambda f: (f / "config.json").write_text("[1, 2]"),
    "record-not-an-object": lambda f: (f / "draftzoo.json").write_text("[1, 2]"),
    "d2t-out-of-range": _tensors(lambda t: t.__setitem__("d2t", t["d2t"] + 10**6)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_broken_drafter_folder_is_one_line(case, tiny_drafters, testbed_tiny, tmp_path, capsys):
    from draftzoo.cli import main

    folder = tmp_path / "drafter"
    shutil.copytree(tiny_drafters["eagle3"], folder)
    CASES[case](folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    args = ["generate", "--target", str(testbed_tiny[0]), "--drafter", str(folder)]
    assert main([*args, "--prompt", "def f(x):", "--max-new-tokens", "4"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "draftzoo" in line]
    assert len(err) == 1 and err[0].startswith("draftzoo: error: "), err
    assert str(folder) in err[0]
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before
