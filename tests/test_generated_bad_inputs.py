"""Generated bad inputs (hypothesis): damaged drafter folders, zoo indexes, reports, recipes,
datasets and numeric options, run through the CLI. Every run either succeeds or exits 2 with
one `draftzoo: error:` line and no traceback, and a canary folder beside the inputs (its files,
and the links the damaged inputs point into it) is byte-identical afterwards. The tally of
what was tried is printed after the test results (`tests/suite_counts.py`)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftzoo.cli import main
from tests.suite_counts import GENERATED

SETTINGS = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,  # the same examples on every run
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
)
JSON = st.recursive(
    JSON_LEAF,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def _snapshot(root: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every entry under `root`: files by content, links by target."""
    out: dict[str, tuple[str, bytes | str]] = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            out[key] = ("link", str(path.readlink()))
        elif path.is_file():
            out[key] = ("file", path.read_bytes())
        else:
            out[key] = ("dir", "")
    return out


@pytest.fixture(scope="module")
def canary(tmp_path_factory) -> Path:
    """Files a damaged input may point at; nothing may change them."""
    root = tmp_path_factory.mktemp("canary")
    (root / "secret.safetensors").write_bytes(b"not yours" * 10)
    (root / "notes.txt").write_text("the user's own notes\n")
    (root / "folder").mkdir()
    (root / "folder" / "draftzoo.json").write_text('{"family": "eagle3"}')
    return root


def _run(kind: str, argv: list[str], canary: Path) -> None:
    """`draftzoo argv`: exit 0, or exit 2 with one error line; the canary untouched."""
    before = _snapshot(canary)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    text = err.getvalue()
    assert code in (0, 2), (argv, code, text[-2000:])
    assert "Traceback" not in text, (argv, text[-2000:])
    if code == 2:
        errors = [line for line in text.splitlines() if line.startswith("draftzoo: error: ")]
        assert len(errors) == 1, (argv, text[-2000:])
    assert _snapshot(canary) == before, argv
    GENERATED[f"{kind} {'refused' if code == 2 else 'accepted'}"] += 1


# -- drafter folders ---------------------------------------------------------------------------

DAMAGE = st.one_of(
    st.tuples(st.just("config"), st.text(min_size=1, max_size=20), JSON),
    st.tuples(st.just("record"), st.text(min_size=1, max_size=20), JSON),
    st.tuples(
        st.just("truncate"), st.sampled_from(["model.safetensors", "config.json"]), st.floats(0, 1)
    ),
    st.tuples(st.just("flip"), st.integers(0, 300), st.integers(1, 255)),
    st.tuples(
        st.just("delete"),
        st.sampled_from(["model.safetensors", "config.json", "draftzoo.json"]),
        st.none(),
    ),
    st.tuples(st.just("link"), st.sampled_from(["model.safetensors", "config.json"]), st.none()),
)


def _damage(folder: Path, damage, canary: Path) -> None:
    kind, what, value = damage
    if kind in ("config", "record"):
        path = folder / ("config.json" if kind == "config" else "draftzoo.json")
        data = json.loads(path.read_text())
        keys = sorted(data) if isinstance(data, dict) else []
        pick = sum(map(ord, what))  # not hash(): str hashes differ between processes
        key = keys[pick % len(keys)] if keys and not what.startswith("+") else what
        data[key] = value
        path.write_text(json.dumps(data))
    elif kind == "truncate":
        path = folder / what
        blob = path.read_bytes()
        path.write_bytes(blob[: int(len(blob) * value)])
    elif kind == "flip":
        path = folder / "model.safetensors"
        blob = bytearray(path.read_bytes())
        blob[what % len(blob)] ^= value
        path.write_bytes(bytes(blob))
    elif kind == "delete":
        (folder / what).unlink()
    else:  # a file replaced by a link out of the folder
        (folder / what).unlink()
        (folder / what).symlink_to(canary / "secret.safetensors")


@SETTINGS
@given(damage=DAMAGE, family=st.sampled_from(["eagle3", "eagle1", "draft_lm"]))
def test_damaged_drafter_folders(damage, family, tiny_drafters, testbed_tiny, canary):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "drafter"
        shutil.copytree(tiny_drafters[family], folder)
        _damage(folder, damage, canary)
        target = str(testbed_tiny[0])
        generate = ["generate", "--drafter", str(folder), "--target", target, "--prompt", "def f("]
        _run("drafter folder", [*generate, "--max-new-tokens", "3"], canary)
        export = ["export", str(folder), "--format", "vllm", "--output-dir", f"{tmp}/out"]
        _run("drafter folder", [*export, "--target", target], canary)
        _load_in_python(folder, target, canary)


def _load_in_python(folder: Path, target: str, canary: Path) -> None:
    """`draftzoo.load` on the folder: a generator, or a typed `DraftzooError`."""
    import draftzoo

    before = _snapshot(canary)
    try:
        draftzoo.load(folder, target)
        outcome = "accepted"
    except draftzoo.DraftzooError:
        outcome = "refused"
    assert _snapshot(canary) == before
    GENERATED[f"python load {outcome}"] += 1


# -- zoo indexes and reports -------------------------------------------------------------------


@SETTINGS
@given(index=JSON, report=JSON)
def test_damaged_zoo_indexes_and_reports(index, report, tiny_drafters, canary):
    with tempfile.TemporaryDirectory() as tmp:
        zoo = Path(tmp) / "zoo"
        zoo.mkdir()
        (zoo / "index.json").write_text(json.dumps(index))
        report_path = Path(tmp) / "report.json"
        report_path.write_text(json.dumps(report))
        _run("zoo index", ["zoo", "list", "--zoo", str(zoo)], canary)
        board = ["leaderboard", "--zoo", str(zoo), "--output-dir", f"{tmp}/board"]
        _run("zoo index", board, canary)
        _run(
            "report",
            [*board[:1], "--report", str(report_path), "--output-dir", f"{tmp}/b2"],
            canary,
        )
        publish = ["publish", str(tiny_drafters["eagle3"]), "--report", str(report_path)]
        _run("report", [*publish, "--zoo", f"{tmp}/zoo2"], canary)


# -- recipes and datasets ----------------------------------------------------------------------

RECIPE_KEYS = st.sampled_from(
    [
        "train.max_steps",
        "train.lr",
        "train.micro_batch_size",
        "train.warmup_steps",
        "train.loss_chunk_rows",
        "train.schedule",
        "train.decay_fraction",
        "train.checkpoint_steps",
        "train.start_from",
        "train.rows",
        "train.mixed_precision",
        "data.max_length",
        "data.packing",
        "data.truncation",
        "capture.mode",
        "capture.dtype",
        "draft.hidden_size",
        "draft.num_hidden_layers",
        "distill.loss",
        "distill.temperature",
        "family",
        "target.dtype",
    ]
)


PLAUSIBLE = st.one_of(
    st.integers(0, 600),
    st.floats(0, 2),
    st.sampled_from(["cosine", "wsd", "bf16", "no", "offline", "float8_e4m3", "ce", "fkl", "drop"]),
)


@SETTINGS
@given(key=RECIPE_KEYS, value=st.one_of(PLAUSIBLE, JSON))
def test_damaged_recipes(key, value, testbed_tiny, canary):
    from tests.train.helpers import recipe_yaml, tiny_recipe

    with tempfile.TemporaryDirectory() as tmp:
        recipe = tiny_recipe(Path(tmp), testbed_tiny[0], canary / "notes.txt")
        path = recipe_yaml(recipe, Path(tmp) / "r.yaml")
        data = yaml.safe_load(path.read_text())
        section, _, field = key.rpartition(".")
        (data.setdefault(section, {}) if section else data)[field] = value
        path.write_text(yaml.safe_dump(data))
        _run("recipe", ["train", str(path), "--check"], canary)


LINE = st.one_of(
    JSON.map(json.dumps),
    st.text(max_size=30),
    st.binary(max_size=30).map(lambda b: b.decode("latin-1")),
    st.lists(st.fixed_dictionaries({"role": st.text(max_size=9), "content": JSON}), max_size=3).map(
        lambda m: json.dumps({"messages": m})
    ),
)


@SETTINGS
@given(lines=st.lists(LINE, min_size=1, max_size=5))
def test_damaged_datasets(lines, testbed_tiny, canary):
    from tests.train.helpers import recipe_yaml, tiny_recipe

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.jsonl"
        data.write_text("\n".join(lines) + "\n")
        recipe = tiny_recipe(Path(tmp), testbed_tiny[0], data, data={"max_length": 64})
        path = recipe_yaml(recipe, Path(tmp) / "r.yaml")
        _run("dataset", ["capture", str(path), "--dir", f"{tmp}/shards"], canary)


# -- numeric options ---------------------------------------------------------------------------

NUMBER = st.one_of(
    st.integers(-(10**15), 0).map(str),
    st.integers(10**7, 10**15).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.text(max_size=4),
    st.integers(1, 8).map(str),
)
OPTIONS = st.sampled_from(
    [
        "--max-new-tokens",
        "--temperature",
        "--top-k",
        "--top-p",
        "--seed",
        "--tree-top-k",
        "--tree-depth",
        "--tree-tokens",
        "--num-speculative-tokens",
        "--max-cache-length",
        "--min-ngram",
        "--max-ngram",
        "--suffix-depth",
        "--suffix-max-draft",
    ]
)


@SETTINGS
@given(option=OPTIONS, value=NUMBER, proposer=st.sampled_from(["--drafter", "--prompt-lookup"]))
def test_out_of_range_numeric_options(option, value, proposer, tiny_drafters, testbed_tiny, canary):
    argv = ["generate", "--target", str(testbed_tiny[0]), "--prompt", "def f(", proposer]
    if proposer == "--drafter":
        argv.append(str(tiny_drafters["eagle3"]))
    if option in ("--tree-top-k", "--tree-depth", "--tree-tokens"):
        argv.append("--tree")
    if option in ("--suffix-depth", "--suffix-max-draft"):
        argv = [
            a
            for a in argv
            if a not in ("--prompt-lookup", "--drafter", str(tiny_drafters["eagle3"]))
        ]
        argv.append("--suffix")
    if option != "--max-new-tokens":
        argv += ["--max-new-tokens", "3"]
    _run("numeric option", [*argv, f"{option}={value}"], canary)


# -- the Python API ----------------------------------------------------------------------------

PROMPTS = st.one_of(
    st.text(max_size=6),
    st.lists(st.one_of(st.integers(-3, 10**12), JSON_LEAF), max_size=4),
    JSON,
)


@pytest.fixture(scope="module")
def tiny_generator(tiny_drafters, tiny_target_model):
    import draftzoo

    model, tokenizer, _ = tiny_target_model
    return draftzoo.load(tiny_drafters["eagle3"], model, tokenizer)


@SETTINGS
@given(prompt=PROMPTS)
def test_generated_prompts_through_the_api(prompt, tiny_generator):
    """Any value as a prompt: generated from, or refused with a `DraftzooError` (ids outside
    the vocabulary, booleans, floats, nested lists, None, an empty prompt)."""
    import draftzoo
    from draftzoo.inference.sampling import SamplingParams

    try:
        tiny_generator.generate(prompt, SamplingParams(max_new_tokens=2))
        outcome = "accepted"
    except draftzoo.DraftzooError:
        outcome = "refused"
    GENERATED[f"python generate {outcome}"] += 1


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ({"target": 123}, "not int"),
        ({"target": [1]}, "not list"),
        ({"device": "banana"}, "not a device"),
        pytest.param(
            {"device": "cuda:0"},
            "not a device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here"),
        ),
        ({"device": 3.5}, "not a device"),
        ({"dtype": "float32"}, "torch.dtype"),
        ({"name_or_path": 5}, "not int"),
    ],
)
def test_load_refuses_arguments_of_the_wrong_kind(arguments, said, tiny_drafters):
    import draftzoo

    given_arguments = {"name_or_path": tiny_drafters["eagle3"], **arguments}
    with pytest.raises(draftzoo.DraftzooError, match=said) as err:
        draftzoo.load(**given_arguments)
    assert isinstance(err.value, TypeError) and "\n" not in str(err.value)
