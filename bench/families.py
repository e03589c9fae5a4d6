"""Every drafter family on one target at one training budget, measured side by side.

    python bench/families.py                       # train what is missing, measure, rank
    python bench/families.py --phase train         # resumable: rerun the same command
    python bench/families.py --phase eval --threads 2
    python bench/families.py --phase board --output-dir bench/results/families-cpu
    python bench/families.py --target smollm2-135m-instruct --work runs --phase eval \
        --threads 2 --certificate-later     # then --phase certify, --phase board

`--target testbed-small` (the default) is described below. `--target smollm2-135m-instruct`:
the SmolLM2 recipes (1,100 steps x 4 rows x 512 positions each; Medusa-2 950 heads-only
steps then 150 joint ones), trained by `bench/smollm2_train.sh` from one offline FP8 capture
into <work>/<family>-smollm2-135m-instruct; measured on 8 HumanEval prompts and 8 of the
held-out `runs/smollm2-data/eval-turns.jsonl` (prompts overlapping the training data dropped
first), with hybrid rows for EAGLE-3 and DFlash only and EAGLE trees of 16 tokens (top-k 4,
depth 4) rather than EAGLE-2's 60, which cost 4.4 single-token forwards to verify here.

The budget is the zoo recipes' own: 3,276,800 packed training positions per family (about
1.6 M supervised tokens): 3,200 steps x 4 rows x 256 positions for EAGLE-1, EAGLE-3, MTP and
Medusa-1; 400 steps x 2 processes x 8 rows x 512 for the draft LM; Medusa-2 spends it in two
stages (Medusa's recipe), 1,600 heads-only steps, then 1,600 joint steps with the LoRA. Every
family reads the same data (`testbed-chat`, the testbed's training split). The script checks
the budget from the recipes before anything runs.

Train: each stage runs `draftzoo train` (`accelerate launch` for the DDP draft LM) into
<work>/<stage>; an interrupted stage resumes from its checkpoint when rerun. A family whose
shipped zoo drafter was trained by exactly this recipe (every field it recorded equal, the
same process count; `auto` precision compared as resolved here) is taken from the zoo rather
than retrained; --retrain trains it anyway.
Eval: one process, one target; every drafter with `draftzoo.eval.evaluate` (target-only and
speculative interleaved prompt by prompt, certificate included), chain and, where the family
has them, trees and hybrid trees (its tree with suffix decoding's branches); prompt lookup and
suffix decoding (chain and tree) the same way; transformers' assisted generation with the draft
LM beside draftzoo's target-only, interleaved. Reports go to <work>/reports/<row>/; a row
already measured is kept (so the phase resumes too). `--certificate-later` leaves the
certificates out, so that every timed row fits in one sitting; `--phase certify` then adds
them (untimed; any sitting, resumable), serving each row as its report did.
Board: `draftzoo.eval.leaderboard` over those reports and the reference rows.
Ship (only when asked, `--phase ship`): each family's best measured row (T = 0 speedup, chain
or tree) is published into the shipped zoo under the family's zoo name, with its report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from draftzoo.architectures.defaults import recipes_dir
from draftzoo.architectures.drafter_io import checkpoint_hash, read_drafter_record
from draftzoo.inference.proposal_settings import CHAIN, HYBRID, TREE
from draftzoo.train.registry import load_recipe

ZOO = recipes_dir() / "zoo"


@dataclass(frozen=True)
class Stage:
    """One training run of a family."""

    folder: str  # under the work folder
    recipe: str  # under recipes/
    overrides: tuple[str, ...] = ()
    processes: int = 1
    zoo_name: str | None = None  # the shipped drafter this recipe may have trained


#: families that draft trees as well as chains (rows for both)
TREES = ("eagle1", "eagle3", "medusa1", "medusa2", "dflash")


@dataclass(frozen=True)
class Profile:
    """One target's families, budget and measurement."""

    target: str
    families: dict[str, list[Stage]]
    budget: int  # packed training positions per family
    prompt_sets: tuple[str, ...]
    heldout_from: tuple[str, ...] = ()
    trainer: tuple[str, ...] = ()  # a script that trains every family (else one run a stage)
    max_prompts: int = 12  # from each prompt set
    hybrid: tuple[str, ...] = TREES  # families measured with suffix decoding's branches too
    #: `EvalConfig` fields of EAGLE rows (their dynamic trees' budget; Medusa's and DFlash's
    #: static trees are their own)
    eagle_settings: tuple[tuple[str, int], ...] = ()


TESTBED = Profile(
    target="testbed-small",
    families={
        "draft_lm": [
            Stage("draft-lm", "draft_lm/testbed-small.yaml", (), 2, "draft-lm-testbed-small")
        ],
        "eagle1": [Stage("eagle1", "eagle1/testbed-small.yaml", zoo_name="eagle1-testbed-small")],
        "eagle3": [Stage("eagle3", "eagle3/testbed-small.yaml", zoo_name="eagle3-testbed-small")],
        "mtp": [Stage("mtp", "mtp/testbed-small.yaml", zoo_name="mtp-testbed-small")],
        "dflash": [Stage("dflash", "dflash/testbed-small.yaml", zoo_name="dflash-testbed-small")],
        "medusa1": [
            Stage("medusa1", "medusa1/testbed-small.yaml", zoo_name="medusa1-testbed-small")
        ],
        "medusa2": [
            Stage("medusa2-heads", "medusa1/testbed-small.yaml", ("train.max_steps=1600",)),
            Stage(
                "medusa2",
                "medusa2/testbed-small.yaml",
                ("train.max_steps=1600", "init_heads={work}/medusa2-heads"),
                zoo_name="medusa2-testbed-small",  # shipped under this name; never reused
            ),
        ],
    },
    budget=3_276_800,
    prompt_sets=("humaneval", "stdlib-heldout"),
)
SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_DATA = "runs/smollm2-data"


def _smollm2_stage(family: str, recipe_family: str | None = None, *overrides: str) -> Stage:
    folder = f"{family.replace('_', '-')}-{SMOLLM2_NAME}"  # as the recipes name them
    recipe = f"{recipe_family or family}/{SMOLLM2_NAME}.yaml"
    return Stage(folder, recipe, overrides, zoo_name=folder)


SMOLLM2 = Profile(
    target=SMOLLM2_NAME,
    families={
        **{
            family: [_smollm2_stage(family)]
            for family in ("draft_lm", "eagle1", "eagle3", "mtp", "dflash", "medusa1")
        },
        "medusa2": [
            Stage(
                f"medusa2-heads-{SMOLLM2_NAME}",
                f"medusa1/{SMOLLM2_NAME}.yaml",
                ("train.max_steps=950",),
            ),
            _smollm2_stage("medusa2"),
        ],
    },
    budget=2_252_800,
    prompt_sets=("humaneval", f"{SMOLLM2_DATA}/eval-turns.jsonl"),
    heldout_from=(f"{SMOLLM2_DATA}/train.jsonl",),
    trainer=("bash", "bench/smollm2_train.sh"),
    # target-only decoding runs 3-4x slower than testbed-small's (22 against 71-95 tokens/s
    # on two cores): 8 prompts a set, and hybrids of EAGLE-3 and DFlash only, keep every
    # timed row within one sitting
    max_prompts=8,
    hybrid=("eagle3", "dflash"),
    # EAGLE-2's own budget (60 tokens) costs a verification forward of 4.4 single-token ones on
    # this CPU (bench/results/cpu-2026-12-05-smollm2-forward-cost): EAGLE trees the size of
    # Medusa's and DFlash's 16 nodes instead
    eagle_settings=(("tree_top_k", 4), ("tree_depth", 4), ("tree_tokens", 16)),
)
PROFILES = {profile.target: profile for profile in (TESTBED, SMOLLM2)}
PROFILE = TESTBED  # the one this run measures (main() sets it from --target)
FAMILIES = TESTBED.families
#: DFlash drafts a block of 8: its chain is the block's 7 tokens (its tree: the default one)
CHAIN_LENGTH = {"dflash": 7}


def _overrides(stage: Stage, work: Path) -> list[str]:
    """The stage's recipe overrides, its output folder under `work` included."""
    return [o.format(work=work) for o in stage.overrides] + [f"output_dir={work / stage.folder}"]


def _recipe(stage: Stage, work: Path):
    return load_recipe(recipes_dir() / stage.recipe, _overrides(stage, work))


def positions(stage: Stage, work: Path) -> int:
    """Packed training positions one stage reads."""
    recipe = _recipe(stage, work)
    train = recipe.train
    rows = train.max_steps * train.micro_batch_size * train.grad_accum * stage.processes
    return rows * recipe.data.max_length


def check_budget(work: Path) -> None:
    """Every family spends exactly the profile's budget (before anything runs)."""
    for family, stages in FAMILIES.items():
        spent = sum(positions(stage, work) for stage in stages)
        if spent != PROFILE.budget:
            sys.exit(f"families: {family} spends {spent:,} positions, not {PROFILE.budget:,}")


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def zoo_match(stage: Stage, work: Path) -> Path | None:
    """The shipped drafter, when this very recipe trained it; else None."""
    from draftzoo.train.precision import resolve_mixed_precision, training_device

    if stage.zoo_name is None or not (ZOO / stage.zoo_name / "draftzoo.json").is_file():
        return None
    record = read_drafter_record(ZOO / stage.zoo_name)
    if record.get("training", {}).get("num_processes", 1) != stage.processes:
        return None
    wanted = _flat(json.loads(json.dumps(asdict(_recipe(stage, work)))))
    recorded = _flat(record["recipe"])
    precision = "train.mixed_precision"
    if wanted.get(precision) == "auto" and recorded.get(precision) != "auto":
        wanted[precision] = resolve_mixed_precision("auto", training_device(False))
    ignored = ("output_dir", "name")
    # a field the record lacks did not exist yet; its default keeps the old behaviour
    same = all(wanted.get(k) == v for k, v in recorded.items() if k not in ignored)
    return ZOO / stage.zoo_name if same else None


def drafter_of(family: str, work: Path, retrain: bool) -> tuple[Path | None, str]:
    """(the family's trained drafter or None, where it comes from)."""
    last = FAMILIES[family][-1]
    if not retrain and len(FAMILIES[family]) == 1:
        shipped = zoo_match(last, work)
        if shipped is not None:
            return shipped, "the shipped zoo drafter (trained by this very recipe)"
    folder = work / last.folder
    if _finished(last, work):
        return folder, "trained here"
    return None, "not trained yet"


def _finished(stage: Stage, work: Path) -> bool:
    folder = work / stage.folder
    if not (folder / "draftzoo.json").is_file():
        return False
    steps = read_drafter_record(folder).get("training", {}).get("steps")
    return steps == _recipe(stage, work).train.max_steps


def train(work: Path, families: list[str], retrain: bool) -> None:
    """Run every missing stage, in order (resumes an interrupted one); a profile with its own
    trainer script runs that instead."""
    if PROFILE.trainer:
        env = {**os.environ, "RUNS": str(work), "FAMILIES": " ".join(families)}
        print(f"[train] {' '.join(PROFILE.trainer)} (RUNS={work})", flush=True)
        subprocess.run(list(PROFILE.trainer), check=True, env=env)
        return
    for family in families:
        drafter, source = drafter_of(family, work, retrain)
        if drafter is not None:
            print(f"[train] {family}: {source}: {drafter}", flush=True)
            continue
        for stage in FAMILIES[family]:
            if _finished(stage, work):
                continue
            command = [sys.executable, "-m", "draftzoo", "train", str(recipes_dir() / stage.recipe)]
            if stage.processes > 1:
                launch = recipes_dir() / "launch" / "ddp.yaml"
                command = [
                    *("accelerate", "launch", "--config_file", str(launch)),
                    *("--num_processes", str(stage.processes), "-m", "draftzoo"),
                    *("train", str(recipes_dir() / stage.recipe)),
                ]
            for override in _overrides(stage, work):
                command += ["--set", override]
            print(f"[train] {family}/{stage.folder}: {' '.join(command)}", flush=True)
            began = time.time()
            subprocess.run(command, check=True)
            print(f"[train] {stage.folder} done in {time.time() - began:.0f} s", flush=True)


def eval_config(proposal: str, chain: int = 4, certificate: bool = True, family: str = ""):
    """The leaderboard's measurement: the zoo cards' prompts, batch 1, one repeat (without the
    certificate when `certificate` is False: `--phase certify` adds it later)."""
    from draftzoo.eval.runner import EvalConfig
    from draftzoo.inference.proposal_settings import from_config

    tree = dict(PROFILE.eagle_settings if family in ("eagle1", "eagle3") else ())
    config = EvalConfig(
        prompt_sets=PROFILE.prompt_sets,
        heldout_from=PROFILE.heldout_from,
        max_prompts=PROFILE.max_prompts,
        max_new_tokens=128,
        temperatures=(0.0, 1.0),
        proposal=from_config({"proposal": proposal, "num_speculative_tokens": chain, **tree}),
    )
    return config if certificate else replace(config, certificate_samples=0)


@dataclass(frozen=True)
class Row:
    """One leaderboard row this script measures: a trained drafter or a model-free proposer."""

    name: str  # its report's folder under <work>/reports
    proposal: str
    chain: int = 4
    drafter: Path | None = None  # None: model-free (the name says which)
    family: str = ""  # the drafter's


def rows_of(work: Path, families: list[str]) -> list[Row]:
    """Every trained drafter (chain, and tree and hybrid where it has them), then prompt
    lookup and suffix decoding (chain and tree)."""
    rows = []
    for family in families:
        drafter, source = drafter_of(family, work, retrain=False)
        if drafter is None:
            print(f"[eval] {family}: {source}; skipped", flush=True)
            continue
        proposals = (CHAIN, TREE) if family in TREES else (CHAIN,)
        for proposal in proposals + ((HYBRID,) if family in PROFILE.hybrid else ()):
            chain = CHAIN_LENGTH.get(family, 4)
            rows.append(Row(f"{family}-{proposal}", proposal, chain, drafter, family))
    rows.append(Row("prompt-lookup-chain", CHAIN))
    rows += [Row("suffix-chain", CHAIN), Row("suffix-tree", TREE)]
    return rows


def load_row(row: Row, config):
    """A fresh target (Medusa-2 adapts it), its tokenizer and the row's runtime."""
    from draftzoo.inference.load import load_drafter, load_target
    from draftzoo.inference.proposers.prompt_lookup import prompt_lookup_runtime
    from draftzoo.inference.proposers.suffix_decoding import suffix_runtime

    target, tokenizer = load_target(PROFILE.target, config.torch_dtype)
    if row.drafter is not None:
        runtime = load_drafter(row.drafter, target, tokenizer, config.proposal)
    elif row.name.startswith("prompt-lookup"):
        runtime = prompt_lookup_runtime(None, config.proposal)
    else:
        runtime = suffix_runtime(None, config.proposal)
    return target, tokenizer, runtime


def measure(work: Path, families: list[str], certificate: bool) -> None:
    """Every row not measured yet, then transformers' assisted generation with the draft LM."""
    from draftzoo.eval.runner import evaluate, write_report

    reports = work / "reports"
    for row in rows_of(work, families):
        out = reports / row.name
        if (out / "report.json").is_file():
            continue
        config = eval_config(row.proposal, row.chain, certificate, row.family)
        target, tokenizer, runtime = load_row(row, config)
        print(f"[eval] {row.name}: {row.drafter or 'model-free'}", flush=True)
        write_report(evaluate(target, tokenizer, runtime, config, PROFILE.target), out)
    draft_lm, _ = drafter_of("draft_lm", work, retrain=False)
    references = work / "references.json"
    if draft_lm is not None and not references.is_file():
        from transformers_reference import assisted_rows

        print("[eval] transformers assisted generation with the draft LM", flush=True)
        rows = assisted_rows(
            draft_lm, eval_config("chain"), _any_report(reports), target_name=PROFILE.target
        )
        references.write_text(json.dumps(rows, indent=1) + "\n")


def certify(work: Path, families: list[str]) -> None:
    """The losslessness certificate for every measured row whose report has none, served as
    its report was (untimed: it may run in another sitting than the timed phase); the rows
    `ship` would publish first, so that a shortened sitting can still ship."""
    from draftzoo.eval.certificate import describe
    from draftzoo.eval.runner import EvalConfig, certificate_of, load_prompts, write_report

    shipped = {path.parent.name for _, path in best_rows(work).values()}
    for row in sorted(rows_of(work, families), key=lambda row: row.name not in shipped):
        path = work / "reports" / row.name / "report.json"
        report = json.loads(path.read_text()) if path.is_file() else {}
        if not report or report.get("certificate"):
            continue
        measured = EvalConfig.from_report(report)
        config = replace(measured, certificate_samples=eval_config("chain").certificate_samples)
        target, tokenizer, runtime = load_row(row, config)
        if row.drafter is not None and report["checkpoint"]["sha256"] != checkpoint_hash(
            row.drafter
        ):
            sys.exit(f"families: {path} measured another checkpoint than {row.drafter}")
        prompts = load_prompts(config)[1:]
        report["certificate"] = certificate_of(target, tokenizer, runtime, config, prompts)
        report["config"] = config.record()
        write_report(report, path.parent)
        print(f"[certify] {row.name}: {describe(report['certificate'])}", flush=True)


def _any_report(reports: Path) -> dict:
    return json.loads(next(iter(sorted(reports.glob("*/report.json")))).read_text())


def board(work: Path, output_dir: Path) -> None:
    """The leaderboard of this run's reports and reference rows."""
    from draftzoo.eval import leaderboard

    rows = []
    for path in sorted((work / "reports").glob("*/report.json")):
        report = json.loads(path.read_text())
        folder = Path(report["checkpoint"]["path"])
        name = path.parent.name
        here = folder if folder.is_dir() else None
        rows.append(leaderboard.row_from_report(report, name, here))
    if (work / "references.json").is_file():
        rows += leaderboard.rows_from_references(work / "references.json")
    title = (
        f"Leaderboard: {PROFILE.target}, every family at {PROFILE.budget / 1e6:.2f} M training "
        "positions"
    )
    for written in leaderboard.write(rows, output_dir, title):
        print(f"[board] {written}")
    print(leaderboard.render(rows, title, plot=None))


def best_rows(work: Path) -> dict[str, tuple[float, Path]]:
    """Each family's measured row with the highest speedup at T = 0 (batch 1): its report."""
    best: dict[str, tuple[float, Path]] = {}
    for path in sorted((work / "reports").glob("*/report.json")):
        report = json.loads(path.read_text())
        family = report["checkpoint"]["family"]
        if family not in FAMILIES:
            continue  # prompt lookup: nothing to ship
        speedup = next(
            r["speedup"]["mean"]
            for r in report["results"]
            if r["batch_size"] == 1 and r["temperature"] == 0
        )
        if family not in best or speedup > best[family][0]:
            best[family] = (speedup, path)
    return best


def ship(work: Path) -> None:
    """Publish each family's best measured row into the shipped zoo, with its report."""
    from draftzoo.eval.publish import publish

    for family, (speedup, path) in best_rows(work).items():
        folder = Path(json.loads(path.read_text())["checkpoint"]["path"])
        name = FAMILIES[family][-1].zoo_name
        published = publish(folder, path, ZOO, name, overwrite=True)
        print(f"[ship] {family}: {path.parent.name} ({speedup:.2f}x at T=0) -> {published}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("runs/families"))
    phases = ("all", "train", "eval", "certify", "board", "ship")
    parser.add_argument("--phase", choices=phases, default="all", help="all: train, eval, board")
    parser.add_argument("--target", choices=sorted(PROFILES), default=TESTBED.target)
    parser.add_argument("--family", action="append", choices=sorted(TESTBED.families))
    parser.add_argument("--retrain", action="store_true", help="train even what the zoo holds")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument("--output-dir", type=Path, help="the board's folder (default: --work)")
    parser.add_argument(
        "--certificate-later",
        action="store_true",
        help="eval: the timed rows only (one sitting); `--phase certify` adds the certificates",
    )
    args = parser.parse_args()
    global PROFILE, FAMILIES
    PROFILE = PROFILES[args.target]
    FAMILIES = PROFILE.families
    if args.threads:
        torch.set_num_threads(args.threads)
    work = args.work.resolve()
    families = args.family or list(FAMILIES)
    check_budget(work)
    if args.phase in ("all", "train"):
        train(work, families, args.retrain)
    if args.phase in ("all", "eval"):
        measure(work, families, certificate=not args.certificate_later)
    if args.phase == "certify":
        certify(work, families)
    if args.phase in ("all", "board"):
        board(work, args.output_dir or work)
    if args.phase == "ship":
        ship(work)


if __name__ == "__main__":
    main()
