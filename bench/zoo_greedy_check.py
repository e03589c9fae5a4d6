"""Reproduce every zoo card's greedy numbers from its own report, through today's loading code.

    python bench/zoo_greedy_check.py [--zoo recipes/zoo] [--threads 1] [--prompts N]

For each drafter in the zoo, the evaluation its report.json recorded is rerun at T = 0, batch 1
(no certificate, one repeat): same prompts, same proposal, same tree. Greedy decoding is
deterministic, so tau and every prompt's (tokens, verification forwards) must equal the
report's; a row that differs prints which prompts moved. Speed is not compared (it depends on
the machine and what runs beside it).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch

from draftzoo.architectures.zoo_index import ZooIndex, builtin_zoo_dir
from draftzoo.eval.measure import load_as_configured
from draftzoo.eval.publish import read_report
from draftzoo.eval.runner import EvalConfig, evaluate
from draftzoo.inference.load import load_target


def greedy_result(report: dict) -> dict:
    """The report's T = 0, batch-1 result."""
    return next(r for r in report["results"] if r["temperature"] == 0 and r["batch_size"] == 1)


def check(folder: Path, prompts: int | None) -> tuple[str, bool]:
    """One zoo drafter: (a line, whether it reproduced)."""
    report = read_report(folder / "report.json")
    config = replace(
        EvalConfig.from_report(report),
        temperatures=(0.0,),
        batch_sizes=(1,),
        repeats=1,
        certificate_samples=0,
        teacher_forced=False,
        position_edges=(),
    )
    if prompts is not None:
        config = replace(config, max_prompts=prompts)
    config, missing = _here(config)
    target, tokenizer = load_target(report["target"]["name"])
    runtime = load_as_configured(folder, target, tokenizer, config)
    again = greedy_result(evaluate(target, tokenizer, runtime, config, report["target"]["name"]))
    card = greedy_result(report)
    if missing:  # the card's rows of the prompt sets that are here, matched by prompt id
        rows = {row["id"]: row for row in card["per_prompt"]}
        now = [row for row in again["per_prompt"] if row["id"] in rows]
        again = {**again, "per_prompt": now}
        card = {"tau": card["tau"], "per_prompt": [rows[row["id"]] for row in now]}
        prompts = len(now)  # a subset: tau is not compared
    moved = [  # prompts in the report's order (ids can repeat: two `__init__`s)
        now["id"]
        for now, then in zip(again["per_prompt"], card["per_prompt"], strict=False)
        if (now["id"], now["tokens"], now["forwards"])
        != (then["id"], then["tokens"], then["forwards"])
    ]
    same = not moved and (prompts is not None or abs(again["tau"] - card["tau"]) < 1e-12)
    line = (
        f"{folder.name:26} {config.proposal.kind:11} card tau {card['tau']:.4f}  "
        f"now {again['tau']:.4f}"
        f"  prompts {len(again['per_prompt'])}, moved {len(moved)}"
        f"{' (' + ', '.join(moved[:4]) + ')' if moved else ''}"
        f"  identity {again['greedy_identity']['identical']}/{again['greedy_identity']['decodes']}"
        + (f"  (not here: {', '.join(missing)})" if missing else "")
    )
    return line, same


def _here(config: EvalConfig) -> tuple[EvalConfig, list[str]]:
    """The config without the prompt-set files and held-out sources this machine lacks (they
    are rebuilt by commands, not committed), and those it dropped."""
    missing = [name for name in config.prompt_sets + config.heldout_from if _absent(name)]
    sets = tuple(name for name in config.prompt_sets if name not in missing)
    sources = tuple(name for name in config.heldout_from if name not in missing)
    return replace(config, prompt_sets=sets, heldout_from=sources), missing


def _absent(name: str) -> bool:
    """A prompt set or data source named by a path that is not here."""
    return name.endswith((".jsonl", ".json")) and not Path(name).is_file()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=builtin_zoo_dir())
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--prompts", type=int, help="only the first N prompts of each set")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    index = ZooIndex(args.zoo)
    results = []
    for name in index.entries():
        line, same = check(index.folder(name), args.prompts)
        print(line, flush=True)
        results.append(same)
    print(f"{sum(results)} of {len(results)} cards reproduced exactly at T = 0")


if __name__ == "__main__":
    main()
