"""What training cost, for shipped drafters whose training did not record it: a short rerun of
each one's recipe, and its card republished with the figures.

    python bench/cost_rerun.py                    # every zoo entry without the figures
    python bench/cost_rerun.py --name eagle3-testbed-small --steps 60

Run it alone on the machine: the figures are a rate and a peak. For each entry its
`recipe.yaml` (the recipe as run) trains --steps steps into a scratch folder with the entry's
process count (`accelerate launch` when it is more than one), its warm-up cut to fit and,
for a second stage, fresh heads (`init_heads` unset: a step costs the same). The scratch run's
record gives supervised tokens per second, peak memory and the capture's bytes per token;
they go beside the card as `training_cost.json`, with the steps, the CPU and the date, and the
entry is republished from itself, so its card shows them. The drafter, its record and its
report are untouched (the checkpoint hash stays). The rate of a short run includes its first
steps, and the card says how many steps measured it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from draftzoo.architectures.defaults import builtin_zoo_dir, recipes_dir
from draftzoo.architectures.drafter_io import read_drafter_record
from draftzoo.architectures.output_folders import write_text_atomically
from draftzoo.architectures.zoo_index import ZooIndex
from draftzoo.eval.model_card import COST_FIELDS, RERUN_COST_FILE
from draftzoo.eval.publish import publish
from draftzoo.eval.runner import REPORT_FILE, environment


def rerun_command(folder: Path, out: Path, steps: int, recipe: dict, processes: int) -> list[str]:
    """`draftzoo train` of the entry's recipe as run (`recipe.yaml`; `recipe`, its record's
    copy), for `steps` steps into `out` with `processes` processes."""
    warmup = min(int(recipe.get("train", {}).get("warmup_steps", 0)), steps // 2)
    command = [sys.executable, "-m", "draftzoo", "train", str(folder / "recipe.yaml")]
    if processes > 1:
        launch = recipes_dir() / "launch" / "ddp.yaml"
        command = [
            *("accelerate", "launch", "--config_file", str(launch)),
            *("--num_processes", str(processes), "-m", "draftzoo"),
            *("train", str(folder / "recipe.yaml")),
        ]
    overrides = [f"output_dir={out}", f"train.max_steps={steps}", f"train.warmup_steps={warmup}"]
    if recipe.get("init_heads"):
        overrides.append("init_heads=null")
    for override in overrides:
        command += ["--set", override]
    return command


def measure(name: str, folder: Path, steps: int) -> dict:
    """The cost figures of a `steps`-step rerun of the entry's recipe, with their provenance."""
    record = read_drafter_record(folder)
    processes = record["training"].get("num_processes", 1)
    with tempfile.TemporaryDirectory(prefix=f"cost-{name}-") as scratch:
        out = Path(scratch) / name
        command = rerun_command(folder, out, steps, record.get("recipe", {}), processes)
        print(f"[cost] {name}: {' '.join(command)}", flush=True)
        began = time.time()
        subprocess.run(command, check=True)
        training = read_drafter_record(out)["training"]
    hardware = environment()["hardware"]
    return {
        "steps": steps,
        "device": f"{hardware['cpu_model']}, {hardware['cpu_count']} cores, {processes} "
        "process(es)",
        "date": time.strftime("%Y-%m-%d"),
        "wall_seconds": round(time.time() - began, 1),
        **{key: training[key] for key in COST_FIELDS if key in training},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=builtin_zoo_dir())
    parser.add_argument("--name", action="append", help="zoo entries (default: every one)")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    index = ZooIndex(args.zoo)
    for name in args.name or sorted(index.entries()):
        folder = index.folder(name)
        training = read_drafter_record(folder).get("training", {})
        if any(key in training for key in COST_FIELDS):
            print(f"[cost] {name}: its training recorded the figures", flush=True)
            continue
        cost = measure(name, folder, args.steps)
        write_text_atomically(folder / RERUN_COST_FILE, json.dumps(cost, indent=1) + "\n")
        publish(folder, folder / REPORT_FILE, args.zoo, name, overwrite=True)
        print(f"[cost] {name}: {json.dumps(cost)}", flush=True)


if __name__ == "__main__":
    main()
