"""`draftzoo publish`: a measured drafter -> the zoo (model card, index entry, files).

    draftzoo publish runs/eagle3-testbed-small --report runs/eagle3-eval/report.json \
        --zoo ~/.cache/draftzoo/zoo [--name eagle3-testbed-small] [--push-to-hub ORG/NAME]

Refused without an eval report, with a report whose checkpoint hash is not this checkpoint's,
one measured with a lossy acceptance or without a passed losslessness certificate, or when
the weights cannot be read. The drafter's folder in the zoo is built
under a temporary name and renamed into place, and the index is rewritten whole under a lock
after that: a publish that fails midway leaves the zoo as it was.
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from ..architectures.drafter_io import (
    DrafterError,
    checkpoint_hash,
    defining_files,
    interrupted_swap,
    read_drafter_record,
    scratch_dir,
)
from ..architectures.errors import DraftzooError
from ..architectures.export import TOKENIZER_FILES
from ..architectures.families import family_spec
from ..architectures.output_folders import (
    refuse_writing_into_inputs,
    restore_interrupted,
    swapped_in,
)
from ..architectures.peer_import import is_peer_folder
from ..architectures.zoo_index import ZooIndex
from ..inference.peer_import import imported_folder
from .beside_files import read_json_beside
from .certificate import describe
from .certificate import headline as certificate_headline
from .engine_runs import ENGINE_RUNS_FILE, read_engine_runs
from .machine_load import unreliable_sentence
from .model_card import RERUN_COST_FILE, draft_vocabulary_note, render_card
from .plots import plot_report
from .runner import REPORT_FILE, SUMMARY_FILE, headline

CARD_FILE = "README.md"
#: files beside a drafter that publish carries into its entry when they are there
BESIDE_FILES = (RERUN_COST_FILE, ENGINE_RUNS_FILE)
RECIPE_FILE = "recipe.yaml"
#: a zoo name: a-z or 0-9 first (so never "." or ".."), then a-z, 0-9, ".", "_", "-"
ZOO_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


class PublishError(DraftzooError, ValueError):
    """A drafter that may not enter the zoo, with the reason."""


def read_report(path: Path | None) -> dict[str, Any]:
    """An eval report; a clear error when there is none."""
    if path is None or not Path(path).is_file():
        raise PublishError(
            f"no eval report at {path}: every published drafter carries measured numbers; run "
            "`draftzoo eval DRAFTER --output-dir DIR` and pass --report DIR/report.json"
        )
    try:
        report = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise PublishError(f"{path} is not a valid eval report: {err}") from err
    if not isinstance(report, dict):
        raise PublishError(f"{path} is not a valid eval report: not a JSON object")
    return report


def check_weights(folder: Path) -> None:
    """Every tensor of model.safetensors reads back (catches truncated or corrupt files)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(folder / "model.safetensors"), "pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                handle.get_tensor(key)
    except (SafetensorError, OSError, RuntimeError) as err:
        raise PublishError(f"{folder / 'model.safetensors'} is corrupt: {err}") from err


def check_certificate(report: dict[str, Any], report_path: Path | None) -> None:
    """Refuse a report without a passed losslessness certificate."""
    certificate = report.get("certificate")
    if not certificate:
        raise PublishError(
            f"the report {report_path} has no losslessness certificate; add one with "
            f"`draftzoo certify DRAFTER --report {report_path}` (or evaluate without "
            "--certificate-samples 0)"
        )
    if not certificate.get("passed"):
        raise PublishError(
            f"the report {report_path}: {describe(certificate)}; the zoo publishes lossless "
            "drafters only"
        )


def train_command(record: dict[str, Any]) -> str:
    """How the drafter was trained, as a command on the published recipe (how it was
    converted, for a drafter trained elsewhere)."""
    imported = record.get("imported")
    if imported:
        target = record.get("recipe", {}).get("target", {}).get("path", "TARGET")
        return (
            f"draftzoo import SOURCE --target {target} --output-dir DRAFTER"
            f"  # SOURCE: the {imported['layout']} folder, sha256 {imported['sha256'][:16]}"
        )
    processes = record.get("training", {}).get("num_processes", 1)
    if processes > 1:
        return (
            "accelerate launch --config_file recipes/launch/ddp.yaml --num_processes "
            f"{processes} -m draftzoo train {RECIPE_FILE}"
        )
    return f"draftzoo train {RECIPE_FILE}"


def publish(
    folder: Path,
    report_path: Path | None,
    zoo: Path,
    name: str | None = None,
    overwrite: bool = False,
    allow_unreliable_timing: bool = False,
) -> Path:
    """Publish drafter `folder` with its report into `zoo`; returns the published folder.
    A report whose speedups were measured on a busy machine is refused unless
    `allow_unreliable_timing` (its card then says so)."""
    folder, zoo = Path(folder), Path(zoo)
    given = folder.name
    if is_peer_folder(folder):  # a peer's layout: its conversion for the report's target
        target = (read_report(report_path).get("target") or {}).get("name")
        folder = imported_folder(folder, target)
    try:
        record = read_drafter_record(folder)
        digest = checkpoint_hash(folder)
    except DrafterError as err:
        raise PublishError(str(err)) from err
    check_weights(folder)
    _refuse_links(folder)
    refuse_writing_into_inputs(zoo, (folder,))
    rerun_cost = rerun_cost_of(folder)  # refused here, before the zoo is touched
    engine_runs = read_engine_runs(folder)  # likewise
    report = _report_of(folder, digest, report_path)
    warning = unreliable_sentence(report)
    if warning and not allow_unreliable_timing:
        raise PublishError(
            f"the report {report_path}: {warning} (or publish it anyway with "
            "--allow-unreliable-timing; its card will say so)"
        )
    name = name or str(record.get("recipe", {}).get("name") or given)
    if not ZOO_NAME.fullmatch(name):
        raise PublishError(
            f"zoo names start with a-z or 0-9 and use a-z, 0-9, '.', '_' and '-': {name!r}"
        )

    index = ZooIndex(zoo)
    with index.locked() as entries:
        if name in entries and not overwrite:
            raise PublishError(f"{name!r} is already in the zoo {zoo}; pass --overwrite to replace")
        target = zoo / name
        interrupted = interrupted_swap(target)
        if interrupted is not None:
            # an earlier publish died between its two renames: put the old entry back first
            restore_interrupted(interrupted, target)
        tmp = scratch_dir(target, "tmp")
        try:
            _build_folder(folder, tmp, name, record, report, report_path, rerun_cost, engine_runs)
            # the old entry is dropped only once the index names the new one: a failing index
            # write puts the old folder back, so folder and index always agree
            with swapped_in(tmp, target, zoo_managed=True):
                entries[name] = _index_entry(name, record, report, digest)
                index.save(entries)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _index_entry(name: str, record: dict, report: dict, digest: str) -> dict[str, Any]:
    """The zoo index's entry for a drafter published as `name`."""
    return {
        "name": name,
        "family": record["family"],
        "target": record["target"],
        "base_model": report["target"]["name"],
        "metrics": headline(report),
        "certificate": certificate_headline(report["certificate"]),
        "serving": report["serving"],
        "files": name,
        "checkpoint_hash": digest,
        "published": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _refuse_links(folder: Path) -> None:
    """A drafter file that is a symbolic link would be copied from wherever it points (and
    pushed with the zoo): publish takes regular files only."""
    for name in (*defining_files(folder), *TOKENIZER_FILES, *BESIDE_FILES):
        path = folder / name
        if path.is_symlink() or (path.parent != folder and path.parent.is_symlink()):
            raise PublishError(
                f"{path} is a symbolic link; publish copies a drafter's own regular files only"
            )


def _report_of(folder: Path, digest: str, report_path: Path | None) -> dict:
    """The report that measured exactly this checkpoint, losslessly, with a passed
    certificate; anything else is refused."""
    report = read_report(report_path)
    measured = report.get("checkpoint", {}).get("sha256")
    if measured != digest:
        raise PublishError(
            f"the report {report_path} measured checkpoint {str(measured)[:16]}…, but {folder} "
            f"is {digest[:16]}…; evaluate this checkpoint before publishing it"
        )
    if report.get("serving", {}).get("lossy"):
        raise PublishError(
            f"the report {report_path} was measured with {report['serving']['acceptance']} "
            "acceptance, which is lossy; the zoo publishes exact (lossless) measurements"
        )
    check_certificate(report, report_path)
    return report


def rerun_cost_of(folder: Path) -> dict[str, Any] | None:
    """The `RERUN_COST_FILE` beside a drafter, checked; None when there is none."""
    path = folder / RERUN_COST_FILE
    cost = read_json_beside(folder, RERUN_COST_FILE, "a training-cost file", PublishError)
    if cost is None:
        return None
    missing = sorted({"steps", "device", "date"} - set(cost)) if isinstance(cost, dict) else []
    if missing or not isinstance(cost, dict):
        what = f"no {', '.join(missing)}" if missing else "not a JSON object"
        raise PublishError(f"{path}: not a training-cost file ({what})")
    return cost


def _build_folder(source, tmp, name, record, report, report_path, rerun_cost, engine_runs) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    for file in (*defining_files(source), *TOKENIZER_FILES):
        if (source / file).is_file():
            (tmp / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / file, tmp / file)
    shutil.copy2(report_path, tmp / REPORT_FILE)
    summary = Path(report_path).with_name(SUMMARY_FILE)
    if summary.is_file():
        shutil.copy2(summary, tmp / SUMMARY_FILE)
    (tmp / RECIPE_FILE).write_text(yaml.safe_dump(record.get("recipe", {}), sort_keys=False))
    for name in BESIDE_FILES:  # a rerun's cost figures, other engines' measurements
        if (source / name).is_file():
            shutil.copy2(source / name, tmp / name)
    plots = [p.name for p in plot_report(report, tmp)]
    config = json.loads((tmp / "config.json").read_text())
    notes = [
        *draft_vocabulary_note(config, record),
        *family_spec(record["family"]).serving_notes(tmp),
    ]
    command = train_command(record)
    card = render_card(name, record, report, plots, command, notes, rerun_cost, engine_runs)
    (tmp / "README.md").write_text(card)


def push_to_hub(folder: Path, repo_id: str, private: bool = False) -> str:
    """Upload a published folder to a Hugging Face hub model repo; returns its URL.

    Needs network access and a token (`huggingface-cli login` or HF_TOKEN)."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    info = api.upload_folder(
        folder_path=str(folder),
        repo_id=repo_id,
        repo_type="model",
        commit_message=f"draftzoo publish {Path(folder).name}",
    )
    return str(info)
