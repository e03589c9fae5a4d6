"""tau against training budget, fitted, and the budget at which the chain would reach a speedup.

    python bench/scaling_curve.py --report 0.3=runs/curve/0.3m/report.json \
        --report 1=runs/curve/1m/report.json ... --goal 2.0 --output-dir bench/results/X

Each `--report BUDGET=PATH` is a `draftzoo eval` report of the drafter trained on BUDGET million
supervised tokens (bench/smollm2_sharegpt.sh's `curve` stage writes them: the same prompts,
chain length and temperatures for every budget). Per temperature: tau = a + b ln(budget) fitted
by least squares over the budgets. The speedup a tau buys follows from what a round costs
against a target-only token, measured in the largest budget's report (the drafter's forward does
not change with its training): r = target tokens/s x (draft + verify ms a round) / 1000, so
speedup ~ tau / r, and the goal needs tau >= goal x r. Printed: the table, the fit, that tau
and the budget the fit puts it at (or why it is out of reach: a chain of k never passes k + 1);
written: scaling-curve.png and scaling-curve.json.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def read(reports: list[str]) -> dict[float, dict]:
    """{budget (M tokens): report}."""
    by_budget = {}
    for item in reports:
        budget, _, path = item.partition("=")
        by_budget[float(budget)] = json.loads(Path(path).read_text())
    if len(by_budget) < 2:
        raise SystemExit("a curve needs reports of at least two budgets")
    return dict(sorted(by_budget.items()))


def batch_one(report: dict, temperature: float) -> dict:
    return next(
        r for r in report["results"] if r["temperature"] == temperature and r["batch_size"] == 1
    )


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(a, b) of tau = a + b ln(budget), least squares."""
    xs = [math.log(budget) for budget, _ in points]
    ys = [tau for _, tau in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    return mean_y - b * mean_x, b


def round_cost(report: dict, temperature: float) -> float:
    """A round's time in target-only tokens (draft + verify ms x target tokens/s)."""
    row = batch_one(report, temperature)
    milliseconds = row["draft_ms_per_round"] + row["verify_ms_per_round"]
    return row["tokens_per_second"]["target"] * milliseconds / 1000


def main() -> None:
    args = _parse_args()
    reports = read(args.report)
    largest = reports[max(reports)]
    depth = largest["config"].get("num_speculative_tokens") or 4
    temperatures = sorted({r["temperature"] for r in largest["results"]})
    summary = {"goal": args.goal, "depth": depth, "temperatures": {}}
    for temperature in temperatures:
        points = [(b, batch_one(rep, temperature)["tau"]) for b, rep in reports.items()]
        a, b = fit(points)
        cost = round_cost(largest, temperature)
        needed = args.goal * cost
        reach = math.exp((needed - a) / b) if b > 0 and needed <= depth + 1 else None
        print(
            f"T = {temperature:g}: tau = {a:.3f} + {b:.3f} ln(M tokens); a round costs "
            f"{cost:.2f} target tokens, so {args.goal:g}x needs tau {needed:.2f}"
        )
        for budget, tau in points:
            speedup = batch_one(reports[budget], temperature)["speedup"]["mean"]
            print(f"  {budget:>6g} M  tau {tau:.3f}  speedup {speedup:.2f}x")
        if reach is None:
            why = (
                f"tau {needed:.2f} is past a chain of {depth}'s {depth + 1}"
                if needed > depth + 1
                else "tau does not grow with the budget"
            )
            print(f"  out of reach: {why}")
        else:
            print(f"  the fit reaches tau {needed:.2f} at ~{reach:.3g} M supervised tokens")
        summary["temperatures"][f"{temperature:g}"] = {
            "points": points,
            "a": a,
            "b": b,
            "round_cost_tokens": cost,
            "tau_needed": needed,
            "budget_needed_m": reach,
        }
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling-curve.json").write_text(json.dumps(summary, indent=1) + "\n")
    _plot(summary, out / "scaling-curve.png")
    print(f"written: {out / 'scaling-curve.json'}, {out / 'scaling-curve.png'}")


def _plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, curve in summary["temperatures"].items():
        budgets = [b for b, _ in curve["points"]]
        ax.plot(budgets, [t for _, t in curve["points"]], "o", label=f"T = {label}")
        span = [min(budgets), max(max(budgets), curve["budget_needed_m"] or 0) * 1.2]
        grid = [span[0] * (span[1] / span[0]) ** (i / 50) for i in range(51)]
        ax.plot(grid, [curve["a"] + curve["b"] * math.log(g) for g in grid], "--", linewidth=1)
        ax.axhline(curve["tau_needed"], linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("supervised training tokens (M)")
    ax.set_ylabel(f"tau, chain of {summary['depth']}")
    ax.set_title(f"tau against budget; dotted: tau for {summary['goal']:g}x", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", action="append", required=True, help="BUDGET=PATH")
    parser.add_argument("--goal", type=float, default=2.0, help="the speedup asked of the chain")
    parser.add_argument("--output-dir", required=True)
    return parser.parse_args()


if __name__ == "__main__":
    main()
