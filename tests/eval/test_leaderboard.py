"""The leaderboard: rows from real reports, measurement groups kept apart, the Pareto front,
the CLI's files, and the README's families table and LEADERBOARD.md in sync with the zoo."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from draftzoo.architectures.zoo_index import builtin_zoo_dir
from draftzoo.cli import main
from draftzoo.eval import leaderboard
from draftzoo.eval.leaderboard import Measured, Row

README = Path(__file__).resolve().parents[2] / "README.md"
ZOO_TITLE = "Leaderboard: every target"


def _report(name: str) -> dict:
    return json.loads((builtin_zoo_dir() / name / "report.json").read_text())


def _on(report: dict, cpu: str | None, threads: int = 2) -> dict:
    moved = copy.deepcopy(report)
    moved["hardware"].update(cpu_model=cpu, torch_threads=threads, cuda=None)
    return moved


def test_rows_carry_the_reports_figures():
    report = _report("eagle1-testbed-small")
    folder = builtin_zoo_dir() / "eagle1-testbed-small"
    row = leaderboard.row_from_report(report, "eagle1", folder)
    batch_one = {r["temperature"]: r for r in report["results"] if r["batch_size"] == 1}
    for temperature, result in batch_one.items():
        measured = row.temperatures[f"T={temperature:g}"]
        assert measured.tau == result["tau"]
        assert measured.speedup == result["speedup"]["mean"]
        assert measured.efficiency == pytest.approx(result["speedup"]["mean"] / result["tau"])
    assert row.train_tokens == report["checkpoint"]["training"]["supervised_tokens"]
    assert row.proposal == "chain of 4" and row.family == "eagle1"
    from safetensors.torch import load_file

    weights = load_file(str(folder / "model.safetensors"))
    assert row.parameters == sum(t.numel() for t in weights.values())


def test_groups_never_mix_hardware_prompts_or_acceptance():
    eagle1, eagle3 = _report("eagle1-testbed-small"), _report("eagle3-testbed-small")
    same = [_on(eagle1, "CPU A"), _on(eagle3, "CPU A")]
    other_cpu, other_threads = _on(eagle3, "CPU B"), _on(eagle3, "CPU A", threads=4)
    other_prompts = _on(eagle3, "CPU A")
    other_prompts["config"]["prompt_sets"] = ["humaneval"]
    raw, lossy = _on(eagle3, "CPU A"), _on(eagle3, "CPU A")
    raw["config"]["chat"] = False
    lossy["config"]["acceptance"] = "typical"
    unnamed = _on(eagle3, None)
    reports = [*same, other_cpu, other_threads, other_prompts, raw, lossy, unnamed]
    reports.append(_on(eagle1, None))
    rows = [leaderboard.row_from_report(r, f"r{i}") for i, r in enumerate(reports)]
    groups = leaderboard.grouped(rows)
    sizes = sorted(len(members) for members in groups.values())
    # the two CPU-A rows share a table; every other row (unnamed CPUs included) stands alone
    assert sizes == [1, 1, 1, 1, 1, 1, 1, 2]
    (pair,) = [m for m in groups.values() if len(m) == 2]
    assert {r.name for r in pair} == {"r0", "r1"}
    assert pair == sorted(pair, key=lambda r: -r.speedup())
    text = leaderboard.render(rows, "t", plot=None)
    assert text.count("| rank |") == 8 and "LOSSY typical acceptance" in text


def test_pareto_front_and_reference_rows():
    def row(name, seconds, speedup, reference=False):
        return Row(
            name,
            "eagle1",
            "chain of 4",
            "g",
            {"T=0": Measured(2.0, speedup)},
            train_seconds=seconds,
            reference=reference,
        )

    rows = [row("a", 100, 1.2), row("b", 200, 1.1), row("c", 300, 1.5), row("d", 50, 0.9)]
    rows.append(row("lookup", None, 1.4, reference=True))
    assert [r.name for r in leaderboard.pareto_front(rows)] == ["d", "a", "c"]
    ranked = leaderboard.grouped(rows)["g"]
    assert [r.name for r in ranked] == ["c", "a", "b", "d", "lookup"]  # references last
    lines = leaderboard.table(ranked)
    assert lines[2].startswith("| 1 | `c` *") and lines[-1].startswith("| ref | `lookup`")


def test_cli_writes_the_board_and_reads_reference_rows(tmp_path, capsys):
    references = tmp_path / "references.json"
    reference = Row("transformers assisted (x)", "transformers_assisted", "chain of 4", "")
    reference.temperatures["T=0"] = Measured(2.1, 0.7)
    reference.group = leaderboard.group_of(_report("mtp-testbed-small"))
    references.write_text(json.dumps([leaderboard.row_as_json(reference)]))
    report = builtin_zoo_dir() / "mtp-testbed-small" / "report.json"
    out = tmp_path / "board"
    argv = ["leaderboard", "--report", str(report), "--references", str(references)]
    assert main([*argv, "--output-dir", str(out)]) == 0
    text = (out / "LEADERBOARD.md").read_text()
    assert (out / "leaderboard.png").stat().st_size > 0
    assert "| 1 | `mtp-testbed-small`" in text and "| ref | `transformers assisted (x)`" in text
    assert text.count("| rank |") == 1  # measured alike: one table
    assert "| 1 |" in capsys.readouterr().out
    assert main(["leaderboard", "--report", str(tmp_path / "missing.json")]) == 2


def test_readme_families_table_and_leaderboard_are_generated_from_the_zoo():
    """`draftzoo leaderboard --zoo recipes/zoo --output-dir recipes/zoo --readme README.md`
    wrote them (every target's drafters, a group per target and machine); editing either by
    hand fails here."""
    rows = leaderboard.rows_from_zoo(builtin_zoo_dir())
    assert {r.family for r in rows} >= {"draft_lm", "eagle1", "eagle3", "medusa1", "mtp"}
    text = README.read_text()
    start = text.index(leaderboard.README_START)
    end = text.index(leaderboard.README_END) + len(leaderboard.README_END)
    assert text[start:end] == leaderboard.families_block(rows)
    committed = (builtin_zoo_dir() / leaderboard.LEADERBOARD_FILE).read_text()
    assert committed == leaderboard.render(rows, ZOO_TITLE)
    assert (builtin_zoo_dir() / leaderboard.PLOT_FILE).is_file()
    assert all(r.certificate and r.certificate["passed"] for r in rows)
    with pytest.raises(ValueError, match="no generated block"):
        leaderboard.replace_block("no markers here", "x")


def test_one_unreadable_report_leaves_the_others_ranked(tmp_path, caplog):
    import shutil

    from draftzoo.architectures.defaults import builtin_zoo_dir
    from draftzoo.eval.leaderboard import rows_from_zoo

    zoo = tmp_path / "zoo"
    shutil.copytree(builtin_zoo_dir(), zoo)
    (zoo / "mtp-testbed-small" / "report.json").write_bytes(b"\xff\xfe")
    (zoo / "eagle1-testbed-small" / "report.json").write_text("[1, 2]")
    names = {row.name for row in rows_from_zoo(zoo, "testbed-small")}
    assert "mtp-testbed-small" not in names and "eagle1-testbed-small" not in names
    assert "eagle3-testbed-small" in names
    assert "zoo entry mtp-testbed-small left out" in caplog.text
