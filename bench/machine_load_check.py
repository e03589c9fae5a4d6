"""The quiet case of the unreliable-timing gate: the shipped EAGLE-3 drafter evaluated on
testbed-small, once alone and once beside one CPU-burning process per core, in one script;
prints each report's machine load and verdict.

    python bench/machine_load_check.py --prompts 6

On a quiet machine the first run is expected to be reliable (other processes' share of CPU
time under draftzoo.eval.machine_load.MAX_OTHER_SHARE) and the second unreliable; if the first
is not, something else is using the machine and the bench says what share.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from draftzoo.eval.runner import EvalConfig, evaluate
from draftzoo.inference.load import load_drafter, load_target, resolve_drafter


def measure(prompts: int) -> dict:
    target, tokenizer = load_target("testbed-small")
    folder, _ = resolve_drafter("eagle3-testbed-small")
    drafter = load_drafter(folder, target, tokenizer)
    config = EvalConfig(
        max_prompts=prompts, max_new_tokens=64, temperatures=(0.0,), certificate_samples=0
    )
    report = evaluate(target, tokenizer, drafter, config, "testbed-small", show_progress=False)
    return {"speedup": report["results"][0]["speedup"]["mean"], **report["timing"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6)
    args = parser.parse_args()
    alone = measure(args.prompts)
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        busy = measure(args.prompts)
    finally:
        for proc in burners:
            proc.kill()
    for name, record in (("alone", alone), ("beside burners", busy)):
        print(
            f"{name:15s} speedup {record['speedup']:.2f}x  other processes' share "
            f"{record.get('other_share', float('nan')):.1%}  reliable {record['reliable']}"
            + (f" ({record['why_unreliable']})" if record["why_unreliable"] else "")
        )


if __name__ == "__main__":
    main()
