"""Print the per-step training loss of a recipe: check that a change to the loop left it alone.

    python bench/loss_curve.py recipes/eagle3/testbed-small.yaml --steps 12 [--set k=v ...]

Trains `--steps` steps into a temporary folder, logging every step to tensorboard, and prints
the logged `train/loss` of each step (and any other `train/` scalar with `--all`). Two runs of
the same recipe and seed on the same machine, before and after a change, must print the same
numbers.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from draftzoo.train.registry import load_recipe, run_recipe


def logged_scalars(work_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} from the tensorboard events under `work_dir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(work_dir.rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events.parent))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars[tag] = [(e.step, e.value) for e in accumulator.Scalars(tag)]
    return scalars


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", type=Path)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--set", action="append", default=[], help="section.key=value")
    parser.add_argument("--all", action="store_true", help="every train/ scalar, not only loss")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"output_dir={tmp}/drafter",
            f"train.max_steps={args.steps}",
            "train.warmup_steps=1",
            "train.log_every=1",
            f"train.checkpoint_every={args.steps}",
            "train.log_with=[tensorboard]",
            *args.set,
        ]
        run_recipe(load_recipe(args.recipe, overrides))
        scalars = logged_scalars(Path(f"{tmp}/drafter.work"))
    tags = sorted(t for t in scalars if t.startswith("train/")) if args.all else ["train/loss"]
    for tag in tags:
        print(tag)
        for step, value in scalars[tag]:
            print(f"  step {step:3d}: {value:.6f}")


if __name__ == "__main__":
    main()
