"""What other engines measured serving a drafter: `engine_runs.json` beside it.

`bench/llama_cpp_bench.py` writes one per drafter it serves (llama.cpp: the build, the export
and serving commands with their flags, tokens per second with the drafter and target-only on
the same prompts, acceptance, greedy identity). `draftzoo publish` carries the file into the
zoo entry, its card shows it ("Served by other engines"), and the leaderboard lists every
entry's runs in their own table, never ranked with draftzoo's own measurements.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..architectures.errors import DraftzooError
from .beside_files import read_json_beside

ENGINE_RUNS_FILE = "engine_runs.json"
RUN_FIELDS = ("engine", "build", "device", "date", "target", "prompts", "export", "command", "rows")
ROW_FIELDS = ("temperature", "tokens_per_second", "target_only_tokens_per_second")


class EngineRunsError(DraftzooError, ValueError):
    """An `engine_runs.json` that is not what it should be."""


def read_engine_runs(folder: Path) -> list[dict[str, Any]] | None:
    """The `ENGINE_RUNS_FILE` beside a drafter, checked; None when there is none."""
    path = Path(folder) / ENGINE_RUNS_FILE
    runs = read_json_beside(folder, ENGINE_RUNS_FILE, "an engine-runs file", EngineRunsError)
    if runs is None:
        return None
    if not isinstance(runs, list) or not runs:
        raise EngineRunsError(f"{path}: not an engine-runs file (a non-empty JSON list)")
    for index, run in enumerate(runs):
        _check(run, RUN_FIELDS, f"{path}: run {index}")
        if not isinstance(run["rows"], list) or not run["rows"]:
            raise EngineRunsError(f"{path}: run {index} has no rows")
        for row in run["rows"]:
            _check(row, ROW_FIELDS, f"{path}: run {index}, a row")
            if not all(_positive(row[k]) for k in ROW_FIELDS[1:]):
                raise EngineRunsError(f"{path}: run {index}: tokens per second must be > 0")
    return runs


def _check(item: Any, fields: tuple[str, ...], where: str) -> None:
    missing = [k for k in fields if not isinstance(item, dict) or k not in item]
    if missing:
        raise EngineRunsError(f"{where} lacks {', '.join(missing)}")


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _row_cells(row: dict[str, Any]) -> str:
    speed, alone = row["tokens_per_second"], row["target_only_tokens_per_second"]
    acceptance = row.get("acceptance")
    accepted = f"{acceptance:.1%}" if isinstance(acceptance, (int, float)) else "-"
    return (
        f"{row['temperature']:g} | {speed:.1f} | {alone:.1f} | {speed / alone:.2f}x | "
        f"{accepted} | {row.get('identical', '-')}"
    )


HEADER = (
    "| T | tokens/s | target-only tokens/s | speedup | accepted / drafted | greedy identity |",
    "|---|---|---|---|---|---|",
)


def card_section(runs: list[dict[str, Any]] | None) -> list[str]:
    """The card's "Served by other engines" section."""
    if not runs:
        return []
    lines = ["", "## Served by other engines", ""]
    for run in runs:
        lines += [
            f"**{run['engine']}** build {run['build']}, {run['device']}, {run['date']}: "
            f"{run['target']}, {run['prompts']}.",
            "",
            "```bash",
            run["export"],
            run["command"],
            "```",
            "",
            *HEADER,
            *(f"| {_row_cells(row)} |" for row in run["rows"]),
            "",
        ]
        if run.get("note"):
            lines += [run["note"], ""]
    return lines


def leaderboard_section(entries: list[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    """Every zoo entry's engine runs, one table per engine build and device: absolute tokens
    per second beside the ratio, never ranked with draftzoo's own rows."""
    tables: dict[str, list[str]] = {}
    for name, runs in entries:
        for run in runs:
            key = f"{run['engine']} build {run['build']} on {run['device']}; {run['prompts']}"
            for row in run["rows"]:
                tables.setdefault(key, []).append(f"| `{name}` | {_row_cells(row)} |")
    lines = []
    for key, rows in tables.items():
        lines += [
            "",
            f"### Served by {key}",
            "",
            "| drafter | " + HEADER[0].removeprefix("| "),
            "|---|" + HEADER[1].removeprefix("|"),
            *rows,
        ]
    return lines
