"""The family registry: every family's pieces resolve, shared modules ask the registry, and a
sixth family (tests/toy_family) added by its own files plus one registry entry trains, loads,
decodes losslessly, evaluates, publishes and exports through the house's shared code."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from draftzoo.architectures.config_io import ConfigError
from draftzoo.architectures.families import (
    FAMILY_MODULES,
    FamilySpec,
    family_spec,
    family_specs,
    register,
    resolve,
    unregister,
)
from draftzoo.cli import main
from draftzoo.inference.proposal_settings import from_name
from tests.toy_family.architecture import TOY_SPEC

REPO = Path(__file__).resolve().parents[1]
#: the shared packages' folders, where no family is named
SHARED = ("architectures", "data", "train", "inference", "eval", "draftzoo")
#: a family file outside the modules its spec names (peft's adapter format, Medusa-2's)
FAMILY_HELPERS = ("lora_adapter",)
#: shared files allowed to name a family, and why
NAMED_ON_PURPOSE = {
    "architectures/families.py": "the registry's usage example",
    "draftzoo/demo.py": "the demo trains the EAGLE-3 demo recipe by design",
}


def family_file_prefixes() -> tuple[str, ...]:
    """Each family's home: the modules its spec names and their siblings (`eagle` covers
    `eagle_batch.py`, `eagle_slots.py`, ...)."""
    stems = {module.rsplit(".", 1)[-1] for module in FAMILY_MODULES}
    for spec in family_specs().values():
        for ref in (spec.recipe, spec.runtime, *spec.exporters.values()):
            stems.add(ref.split(":")[0].rsplit(".", 1)[-1])
    return tuple(sorted(stems | set(FAMILY_HELPERS)))


def test_every_family_resolves_its_pieces():
    specs = family_specs()
    declared = [
        spec.name
        for module in FAMILY_MODULES
        for spec in importlib.import_module(module).FAMILY_SPECS
    ]
    assert list(specs)[: len(declared)] == declared  # one registry line per family home
    for spec in specs.values():
        recipe_class = spec.recipe_class()
        assert "family" in recipe_class.__dataclass_fields__
        for name in ("run", "check_recipe"):
            assert callable(getattr(spec.training_module(), name))
        assert callable(spec.runtime_loader())
        for fmt in spec.export_formats:
            assert callable(spec.exporter(fmt))
        if spec.card_notes:
            assert callable(resolve(spec.card_notes))
        assert list((REPO / "recipes" / spec.recipes_dir).glob("*.yaml")), spec.name
        for test in spec.tests:
            assert (REPO / test).is_file(), test


def test_an_unknown_family_is_refused_listing_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown drafter family 'eagle9'; known: .*draft_lm"):
        family_spec("eagle9")
    with pytest.raises(ValueError, match="already registered"):
        register(FamilySpec(name="eagle3", display_name="x", recipe="a:b", runtime="a:b"))
    with pytest.raises(ValueError, match="not 'module:attribute'"):
        FamilySpec(name="bad", display_name="x", recipe="a.b", runtime="a:b")


def test_shared_modules_name_no_family():
    """No shared module asks "is this EAGLE?": family names appear only in family files."""
    names = "|".join(re.escape(n) for n in family_specs())
    quoted = re.compile(rf"""["']({names})["']""")
    prefixes = family_file_prefixes()
    found = []
    for folder in SHARED:
        for path in sorted((REPO / folder).glob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if path.stem.startswith(prefixes) or relative in NAMED_ON_PURPOSE:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if quoted.search(line):
                    found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


@pytest.fixture
def toy_family():
    register(TOY_SPEC)
    yield TOY_SPEC
    unregister(TOY_SPEC.name)


@pytest.fixture
def toy_drafter(toy_family, testbed_tiny, tmp_path):
    """A bigram drafter trained 4 steps by `draftzoo train` on a recipe naming the family."""
    from tests.train.helpers import TINY_TRAIN, write_chat_jsonl

    chat = write_chat_jsonl(tmp_path / "chat.jsonl", 24)
    recipe = {
        "family": toy_family.name,
        "name": "toy",
        "output_dir": str(tmp_path / "toy"),
        "cache_dir": str(tmp_path / "cache"),
        "target": {"path": str(testbed_tiny[0])},
        "data": {"source": str(chat), "max_length": 128},
        "bigram": {"hidden_size": 16},
        "train": {**TINY_TRAIN, "max_steps": 4, "lr": 1e-2},
    }
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["train", str(path)]) == 0
    folder = tmp_path / "toy"
    assert json.loads((folder / "draftzoo.json").read_text())["family"] == toy_family.name
    return folder


def test_a_sixth_family_needs_only_its_files_and_one_registry_entry(
    toy_drafter, tiny_target_model, tmp_path, capsys
):
    from draftzoo.inference.generate import SpeculativeGenerator
    from draftzoo.inference.load import load_drafter
    from draftzoo.inference.proposer import ProposerError
    from draftzoo.inference.sampling import SamplingParams

    model, tokenizer, _ = tiny_target_model
    runtime = load_drafter(toy_drafter, model, tokenizer, from_name("chain", 3))
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    prompt = "def add(a, b):\n"
    plain = SpeculativeGenerator(model, tokenizer, None).generate(prompt, params)
    drafted = SpeculativeGenerator(model, tokenizer, runtime.make_proposer(), 3).generate(
        prompt, params
    )
    assert drafted.token_ids == plain.token_ids
    assert drafted.metrics.num_target_forwards <= plain.metrics.num_target_forwards
    with pytest.raises(ProposerError, match="Toy bigram drafter drafts chains only"):
        load_drafter(toy_drafter, model, tokenizer, from_name("tree", 3))

    exported = tmp_path / "exported"
    argv = ["export", str(toy_drafter), "--format", "npz", "--output-dir", str(exported)]
    assert main(argv) == 0
    assert (exported / "bigram.npz").is_file()
    assert main([*argv[:2], "--format", "vllm", *argv[4:]]) == 2
    assert "toy_bigram drafter exports to: npz" in capsys.readouterr().err

    report_dir, zoo = tmp_path / "eval", tmp_path / "zoo"
    argv = ["eval", str(toy_drafter), "--prompts", "2", "--max-new-tokens", "16"]
    argv += ["--certificate-samples", "300", "--certificate-prompts", "1"]
    assert main([*argv, "--output-dir", str(report_dir)]) == 0
    report = json.loads((report_dir / "report.json").read_text())
    assert report["checkpoint"]["family"] == "toy_bigram"
    greedy = next(r for r in report["results"] if r["temperature"] == 0)
    assert greedy["greedy_identity"]["rate"] == 1.0
    assert report["certificate"]["passed"]
    report_file = str(report_dir / "report.json")
    assert main(["publish", str(toy_drafter), "--report", report_file, "--zoo", str(zoo)]) == 0
    card = (zoo / "toy" / "README.md").read_text()
    assert "Toy bigram drafter" in card


def test_the_registry_reads_references_lazily():
    assert resolve("draftzoo.architectures.families:family_spec") is family_spec
    assert torch.is_tensor(resolve("torch:zeros")(1))
