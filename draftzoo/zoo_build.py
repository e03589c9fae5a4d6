"""`draftzoo zoo build`: one zoo entry made by the package, from the family's recipe for a target
to a published, certified, measured drafter.

    draftzoo zoo build --family eagle3 --target smollm2-135m-instruct --threads 2 \
        --prompt-set mt-bench --prompts 16 [--set train.max_steps=2000] [--zoo DIR]

The recipe is the family's own for that target (`recipes/<family>/<target>.yaml`, the folder
the family's registry entry names) unless `--recipe` gives another. Four stages, each kept in
`<work>/<name>/` and skipped on a rerun when what it made still holds:

1. train -> `drafter/` (its working folder `drafter.work/` beside it). A drafter whose record
   holds exactly this recipe is kept; an interrupted run resumes from its last checkpoint.
2. measure -> `report/report.json`: target-only and speculative decoding interleaved, no
   certificate, so the timed part is short and should run alone. Kept when it measured this
   checkpoint with these settings.
3. certify -> the losslessness certificate added to that report (untimed). Kept when the report
   holds a passed one of the asked size; a failed certificate stops the build.
4. publish -> the zoo entry `<name>` with its card. Kept when the entry holds this checkpoint
   with this report; otherwise the entry is replaced (`publish --overwrite`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from draftzoo.architectures.config_io import ConfigError, to_dict
from draftzoo.architectures.defaults import recipes_dir
from draftzoo.architectures.drafter_io import RECORD_FILE, checkpoint_hash, read_drafter_record
from draftzoo.architectures.families import family_spec
from draftzoo.architectures.output_folders import output_path
from draftzoo.architectures.zoo_index import ZooIndex
from draftzoo.eval.runner import REPORT_FILE, EvalConfig

STAGES = ("train", "measure", "certify", "publish")


class BuildError(ConfigError):
    """A build that cannot go on (a failed certificate)."""


@dataclass(frozen=True)
class BuildPlan:
    """What one `zoo build` makes, and how it measures it."""

    recipe: Path
    overrides: tuple[str, ...]
    work: Path  # the builds' folder; this entry's stages go in work/<name>
    zoo: Path
    config: EvalConfig  # the measurement; its certificate settings are stage 3's
    name: str | None = None  # default: the recipe's name
    device: str = "cpu"
    allow_unreliable_timing: bool = False


def recipe_for(family: str, target: str) -> Path:
    """The family's recipe for `target`; refused naming the targets it has recipes for."""
    spec = family_spec(family)
    folder = recipes_dir() / (spec.recipes_dir or spec.name)
    path = folder / f"{target}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.yaml"))
        raise ConfigError(
            f"{spec.display_name} has no recipe for {target!r} ({folder}); it has: "
            f"{', '.join(known) or 'none'} (or give one with --recipe)"
        )
    return path


def build_entry(plan: BuildPlan) -> Path:
    """Run the stages that are not done yet; the published entry's folder."""
    from draftzoo.eval.publish import ZOO_NAME
    from draftzoo.train.registry import load_recipe

    name = plan.name or str(load_recipe(plan.recipe, list(plan.overrides)).name)
    if not ZOO_NAME.fullmatch(name):  # it names a folder under --work too: checked first
        raise ConfigError(
            f"zoo names start with a-z or 0-9 and use a-z, 0-9, '.', '_' and '-': {name!r}"
        )
    stages = output_path(Path(plan.work) / name)
    drafter, report = stages / "drafter", stages / "report" / REPORT_FILE
    recipe = load_recipe(plan.recipe, [*plan.overrides, f"output_dir={drafter}"])
    _say("train", _train(recipe, drafter))
    _say("measure", _measure(plan, drafter, report))
    _say("certify", _certify(plan, drafter, report))
    published, said = _publish(plan, name, drafter, report)
    _say("publish", said)
    return published


def _say(stage: str, what: str) -> None:
    print(f"[{STAGES.index(stage) + 1}/{len(STAGES)}] {stage}: {what}", flush=True)


def _train(recipe, drafter: Path) -> str:
    from draftzoo.train.registry import run_recipe

    wanted = json.loads(json.dumps(to_dict(recipe)))
    if (drafter / RECORD_FILE).is_file() and read_drafter_record(drafter)["recipe"] == wanted:
        return f"kept {drafter} (trained by this recipe)"
    result = run_recipe(recipe)
    return f"{drafter}: {result.steps} steps, {result.supervised_tokens} supervised tokens"


def _measure(plan: BuildPlan, drafter: Path, report: Path) -> str:
    from draftzoo.eval.measure import measure_drafter

    timed = replace(plan.config, certificate_samples=0)
    saved = _read(report)
    if saved is not None and _measured(saved, drafter) and _timed_as(saved, timed):
        return f"kept {report} (this checkpoint, these settings)"
    measured, path = measure_drafter(drafter, timed, None, plan.device, report.parent)
    speedups = ", ".join(
        f"T={row['temperature']:g} tau {row['tau']:.2f} {row['speedup']['mean']:.2f}x"
        for row in measured["results"]
        if row["batch_size"] == 1
    )
    return f"{path}: {speedups}"


def _certify(plan: BuildPlan, drafter: Path, report: Path) -> str:
    from draftzoo.eval.certificate import describe
    from draftzoo.eval.measure import certify_report

    samples, prompts = plan.config.certificate_samples, plan.config.certificate_prompts
    held = (_read(report) or {}).get("certificate") or {}
    size = held.get("config") or {}
    asked = size.get("samples") == samples and size.get("prompts") == prompts
    if held.get("passed") and asked:
        return f"kept ({describe(held)})"
    certificate, _ = certify_report(drafter, report, samples, prompts, None)
    if not certificate["passed"]:
        raise BuildError(f"{drafter}: the certificate failed, so it is not published: "
                         f"{describe(certificate)}")  # fmt: skip
    return describe(certificate)


def _publish(plan: BuildPlan, name: str, drafter: Path, report: Path) -> tuple[Path, str]:
    from draftzoo.eval.publish import publish

    index = ZooIndex(plan.zoo)
    entry = index.entries().get(name)
    digest = checkpoint_hash(drafter)
    if entry is not None and entry.get("checkpoint_hash") == digest:
        folder = index.folder(name)
        if _read(folder / REPORT_FILE) == _read(report):
            return folder, f"kept {folder} (this checkpoint, this report)"
    published = publish(
        drafter,
        report,
        plan.zoo,
        name,
        overwrite=True,
        allow_unreliable_timing=plan.allow_unreliable_timing,
    )
    return published, f"{published} (card: {published / 'README.md'})"


def _read(report: Path) -> dict | None:
    try:
        data = json.loads(Path(report).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _measured(report: dict, drafter: Path) -> bool:
    return report.get("checkpoint", {}).get("sha256") == checkpoint_hash(drafter)


def _timed_as(report: dict, timed: EvalConfig) -> bool:
    """Whether `report` measured with the settings `timed` (its certificate's aside: the
    certify stage writes those into the report)."""
    try:
        config = EvalConfig.from_report(report)
    except (KeyError, TypeError, ValueError):
        return False
    return (
        replace(config, certificate_samples=0, certificate_prompts=timed.certificate_prompts)
        == timed
    )
