"""The ablation table: drafters trained at one budget, side by side, from what was measured.

    python bench/ablation_table.py --row base=runs/eagle3-smollm2-sharegpt-0.5m-base \
        --row lk=runs/eagle3-smollm2-sharegpt-0.5m-lk ... --reports runs/ablate \
        --output runs/ablate/table.md

Each `--row NAME=DRAFTER` names a trained drafter folder; its `draftzoo eval` report is
`REPORTS/NAME/report.json` (bench/smollm2_sharegpt.sh's `ablate-eval` stage writes them: the
same prompts, chain of 4, T = 0 and 1, `--teacher-forced`). One line a row: the training record
(steps, supervised tokens, data passes, training-time acceptance of each draft step) and the
report's teacher-forced and runtime tau at each temperature, each against the first row.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_row(name: str, drafter: Path, reports: Path) -> dict:
    """The numbers of one row: its training record and its eval report."""
    training = json.loads((drafter / "draftzoo.json").read_text())["training"]
    report = json.loads((reports / name / "report.json").read_text())
    runtime = {r["temperature"]: r["tau"] for r in report["results"] if r["batch_size"] == 1}
    forced = {r["temperature"]: r for r in report.get("teacher_forced") or []}
    return {
        "name": name,
        "steps": training["steps"],
        "supervised_tokens": training["supervised_tokens"],
        "data_passes": training["data_passes"],
        "train_accuracy": training.get("ttt_accuracy") or [],
        "runtime_tau": runtime,
        "teacher_forced_tau": {t: r["tau"] for t, r in forced.items()},
        "teacher_forced_first": {t: r["acceptance_per_step"][0] for t, r in forced.items()},
        "prompts": report["config"].get("max_prompts"),
        "prompt_sets": report["config"].get("prompt_sets"),
    }


def render(rows: list[dict]) -> str:
    """The markdown table; deltas against the first row."""
    temperatures = sorted(rows[0]["runtime_tau"])
    head = ["row", "steps", "supervised tokens", "passes", "train acc. per step"]
    for t in temperatures:
        head += [f"T={t:g} forced step 1", f"T={t:g} forced tau", f"T={t:g} tau"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = rows[0]
    for row in rows:
        cells = [
            row["name"],
            str(row["steps"]),
            f"{row['supervised_tokens']:,}",
            f"{row['data_passes']:.2f}",
            " ".join(f"{a:.3f}" for a in row["train_accuracy"]),
        ]
        for t in temperatures:
            for key in ("teacher_forced_first", "teacher_forced_tau", "runtime_tau"):
                value, first = row[key].get(t), base[key].get(t)
                if value is None:
                    cells.append("-")
                elif row is base or first is None:
                    cells.append(f"{value:.3f}")
                else:
                    cells.append(f"{value:.3f} ({value - first:+.3f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = _parse_args()
    rows = []
    for item in args.row:
        name, _, folder = item.partition("=")
        rows.append(read_row(name, Path(folder), Path(args.reports)))
    if not rows:
        raise SystemExit("no row to tabulate: train and evaluate one first")
    table = render(rows)
    print(table, end="")
    if args.output:
        Path(args.output).write_text(table)
        Path(args.output).with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", action="append", default=[], help="NAME=DRAFTER_FOLDER")
    parser.add_argument("--reports", required=True, help="folder of NAME/report.json")
    parser.add_argument("--output", help="where the markdown table goes (and a .json beside)")
    return parser.parse_args()


if __name__ == "__main__":
    main()
