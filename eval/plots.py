"""Plots of an eval report, saved as PNG (matplotlib, no display needed).

- `acceptance.png`: per-position acceptance at batch 1, one series per temperature;
- `categories.png`: tau and speedup per category at batch 1;
- `batch.png`: speedup against batch size per temperature, the crossover (speedup < 1) marked
  (only when the report measured more than one batch size).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..architectures.output_folders import fresh_path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def crossover(points: list[tuple[int, float]]) -> int | None:
    """The smallest batch size whose speedup is below 1 (None when speculation always pays)."""
    return next((b for b, s in sorted(points) if s < 1.0), None)


def plot_report(report: dict[str, Any], output_dir: Path) -> list[Path]:
    """Write the plots of `report` into `output_dir`; returns the files written."""
    plt = _pyplot()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    batch_one = [r for r in report["results"] if r["batch_size"] == 1]
    written = []

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r in batch_one:
        values = r["acceptance_per_position"]
        ax.plot(range(1, len(values) + 1), values, marker="o", label=f"T={r['temperature']:g}")
    ax.set_xlabel("draft position k")
    ax.set_ylabel("share of rounds accepting token k")
    ax.set_ylim(0, 1)
    ax.set_title("Per-position acceptance (batch 1)")
    ax.legend()
    written.append(_save(fig, output_dir / "acceptance.png"))

    if batch_one:
        names = sorted(batch_one[0]["categories"])
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
        width = 0.8 / len(batch_one)
        for i, r in enumerate(batch_one):
            xs = [j + i * width for j in range(len(names))]
            label = f"T={r['temperature']:g}"
            left.bar(xs, [r["categories"][n]["tau"] for n in names], width, label=label)
            right.bar(xs, [r["categories"][n]["speedup"] for n in names], width, label=label)
        for ax, title in ((left, "tau"), (right, "speedup over target-only")):
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names)
            ax.set_title(f"{title} per category (batch 1)")
            ax.legend()
        right.axhline(1.0, color="grey", linewidth=0.8)
        written.append(_save(fig, output_dir / "categories.png"))

    sizes = sorted({r["batch_size"] for r in report["results"]})
    if len(sizes) > 1:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for temperature in sorted({r["temperature"] for r in report["results"]}):
            points = [
                (r["batch_size"], r["speedup"]["mean"])
                for r in report["results"]
                if r["temperature"] == temperature
            ]
            points.sort()
            ax.plot(*zip(*points, strict=True), marker="o", label=f"T={temperature:g}")
            cross = crossover(points)
            if cross is not None:
                ax.axvline(cross, linestyle="--", color="red", linewidth=0.8)
                ax.annotate(f"slower from batch {cross}", (cross, 1.0), color="red", fontsize=8)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_xlabel("batch size")
        ax.set_ylabel("speedup over target-only")
        ax.set_title("Speedup against batch size")
        ax.legend()
        written.append(_save(fig, output_dir / "batch.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    with fresh_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    _pyplot().close(fig)
    return path
