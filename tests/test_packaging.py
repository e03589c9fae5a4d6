import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from draftzoo.architectures.families import family_specs

REPO = Path(__file__).resolve().parents[1]
SUBPACKAGES = ["architectures", "data", "train", "inference", "eval", "recipes"]


def test_installed_subpackages_map_to_top_level_folders():
    import importlib

    for name in SUBPACKAGES:
        module = importlib.import_module(f"draftzoo.{name}")
        assert Path(module.__file__).resolve().parent.name == name


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("draftzoo-*.whl")
    return path


def test_wheel_holds_every_subpackage_and_the_committed_testbed(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in SUBPACKAGES:
        assert f"draftzoo/{name}/__init__.py" in names
    assert "draftzoo/cli.py" in names
    assert "draftzoo/architectures/target.py" in names
    assert "draftzoo/recipes/testbed/testbed-small.yaml" in names
    for file in ("model.safetensors", "config.json", "tokenizer.json", "testbed.json"):
        assert f"draftzoo/recipes/testbed/testbed-small/{file}" in names
    for name in (
        "index.json",
        "eagle3-testbed-small/model.safetensors",
        "eagle3-testbed-small/README.md",
        "draft-lm-testbed-small/config.json",
        "medusa2-testbed-small/adapter/adapter_model.safetensors",
        "medusa2-testbed-small/adapter/adapter_config.json",
    ):
        assert f"draftzoo/recipes/zoo/{name}" in names
    assert "draftzoo/recipes/eagle3/testbed-small-demo.yaml" in names
    assert "draftzoo/recipes/medusa2/testbed-small.yaml" in names
    assert not any(n.startswith("tests/") for n in names)


def test_wheel_holds_every_shipped_recipe_and_zoo_file(wheel):
    """Every file under recipes/ that git tracks is in the wheel: recipes of every family,
    launch configs, model configs, the testbed and the zoo (no folder can be missed)."""
    listed = subprocess.run(
        ["git", "ls-files", "recipes"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    shipped = {f"draftzoo/{path}" for path in listed if not path.endswith(".py")}
    recipes = {path for path in shipped if path.endswith(".yaml")}
    assert any("/mtp/" in path for path in recipes)
    for family in family_specs().values():
        assert any(f"/recipes/{family.recipes_dir}/" in path for path in recipes), family.name
    missing = sorted(shipped - set(zipfile.ZipFile(wheel).namelist()))
    assert not missing, missing


def test_wheel_imports_every_subpackage_outside_the_repo(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    code = (
        "import importlib, pathlib\n"
        f"for name in {SUBPACKAGES!r}:\n"
        "    m = importlib.import_module('draftzoo.' + name)\n"
        f"    assert pathlib.Path(m.__file__).is_relative_to({str(target)!r}), m.__file__\n"
        "from draftzoo.train.testbed import committed_testbed_dir\n"
        "assert (committed_testbed_dir() / 'model.safetensors').is_file()\n"
        "print('ok')\n"
    )
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_public_api_reexports():
    import draftzoo
    from draftzoo.inference.generate import SpeculativeGenerator

    assert draftzoo.SpeculativeGenerator is SpeculativeGenerator
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = draftzoo.nope


def test_inference_imports_without_the_training_stack():
    """The GPU image lacks datasets, deepspeed and wandb: the runtime must not need them."""
    code = (
        "import sys\n"
        "for name in ('datasets', 'deepspeed', 'wandb', 'accelerate', 'peft'):\n"
        "    sys.modules[name] = None  # any import of them now fails\n"
        "import draftzoo.inference.generate, draftzoo.inference.proposers\n"
        "import draftzoo.inference.speculation_length, draftzoo.architectures.target\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
