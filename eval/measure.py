"""Measure a drafter by zoo name or folder: what `draftzoo eval` and `draftzoo certify` run.

    report, path = measure_drafter("eagle3-testbed-small", EvalConfig(max_prompts=4), None,
                                   device="cpu", output_dir=Path("runs/e3-eval"))

The drafter's record is read once; its family's spec says what else the measurement needs
(a family that adapts the target also gets its target drift on the evaluation's prompts).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ..architectures.config_io import ConfigError
from ..architectures.drafter_files import DrafterFiles
from ..architectures.families import family_spec
from ..architectures.output_folders import output_path, refuse_writing_into_inputs
from ..architectures.zoo_index import resolve_drafter
from ..inference.drafter_runtime import DrafterRuntime
from ..inference.load import load_drafter, load_target, recorded_target
from ..inference.peer_import import drafter_from_peer
from .plots import plot_report
from .runner import (
    REPORT_FILE,
    EvalConfig,
    certificate_of,
    check_teacher_forced,
    evaluate,
    load_prompts,
    write_report,
)


def load_as_configured(
    folder: Path, target, tokenizer, config: EvalConfig, files: DrafterFiles | None = None
) -> DrafterRuntime:
    """The drafter loaded as an `EvalConfig` serves it (`files`: the folder as opened)."""
    return load_drafter(folder, target, tokenizer, config.proposal, config.cache, files)


def measure_drafter(
    drafter: str | Path,
    config: EvalConfig,
    target_name: str | None,
    device: str,
    output_dir: Path | None = None,
) -> tuple[dict[str, Any], Path]:
    """Evaluate `drafter` (zoo name or folder) on `target_name` (default: its own); the report
    and where it was written (report.json, summary and plots; default runs/eval-NAME)."""
    folder = drafter_from_peer(resolve_drafter(drafter)[0], target_name)
    output_dir = output_path(output_dir or f"runs/eval-{folder.name}")
    refuse_writing_into_inputs(output_dir, (folder,))  # before minutes of decoding
    files = DrafterFiles.open(folder)
    record = files.record
    check_teacher_forced(config, record["family"], folder)
    target_name = target_name or recorded_target(record)
    target, tokenizer = load_target(target_name, config.torch_dtype, device)
    adapts_target = family_spec(record["family"]).adapts_target
    if adapts_target:  # the original target's greedy answers, before the drafter changes it
        original = greedy_answers(target, tokenizer, config)
    runtime = load_as_configured(folder, target, tokenizer, config, files)
    report = evaluate(target, tokenizer, runtime, config, target_name)
    if adapts_target:
        from .target_drift import drift_section, greedy_agreement

        agreement = greedy_agreement(original, greedy_answers(target, tokenizer, config))
        report["target_drift"] = drift_section(record, agreement)
    path = write_report(report, output_dir)
    plot_report(report, output_dir)
    return report, path


def measure_model_free(
    runtime: DrafterRuntime,
    config: EvalConfig,
    target_name: str | None,
    device: str,
    output_dir: Path | None = None,
) -> tuple[dict[str, Any], Path]:
    """Evaluate a proposer that needs no drafter (prompt lookup, suffix decoding) on
    `target_name` (default: the committed testbed); the report and where it was written."""
    from ..architectures.defaults import COMMITTED_TARGET

    output_dir = output_path(output_dir or f"runs/eval-{runtime.family}")  # before decoding
    target_name = target_name or COMMITTED_TARGET
    target, tokenizer = load_target(target_name, config.torch_dtype, device)
    report = evaluate(target, tokenizer, runtime, config, target_name)
    path = write_report(report, output_dir)
    plot_report(report, output_dir)
    return report, path


def greedy_answers(target, tokenizer, config: EvalConfig) -> list[list[int]]:
    """Target-only greedy continuations of the evaluation's prompts (warm-up excluded)."""
    from .target_drift import greedy_tokens

    texts = [p.render(tokenizer, config.chat) for p in load_prompts(config)[1:]]
    return greedy_tokens(target, tokenizer, texts, config.max_new_tokens)


def certify_report(
    drafter: str | Path, report_path: Path, samples: int, prompts: int, target_name: str | None
) -> tuple[dict[str, Any], Path]:
    """Add (or redo) the losslessness certificate in the eval report of `drafter`, serving it
    as that report did; the certificate and the report's path."""
    from .publish import read_report

    report_path = Path(report_path)
    report_path = report_path / REPORT_FILE if report_path.is_dir() else report_path
    if report_path.name != REPORT_FILE:
        raise ConfigError(f"--report: give an eval's {REPORT_FILE} or its folder: {report_path}")
    report = read_report(report_path)
    folder = drafter_from_peer(resolve_drafter(drafter)[0], target_name)
    files = DrafterFiles.open(folder)
    if report.get("checkpoint", {}).get("sha256") != files.sha256:
        raise ConfigError(f"{report_path} measured another checkpoint than {folder}")
    try:
        config = replace(
            EvalConfig.from_report(report),
            certificate_samples=samples,
            certificate_prompts=prompts,
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"draftzoo certify: {report_path}: {err}") from err
    if not config.certificate_samples:
        raise ConfigError("draftzoo certify: --samples must be >= 1")
    target_name = target_name or recorded_target(files.record)
    target, tokenizer = load_target(target_name, config.torch_dtype)
    runtime = load_as_configured(folder, target, tokenizer, config, files)
    measured_prompts = load_prompts(config)[1:]
    report["certificate"] = certificate_of(target, tokenizer, runtime, config, measured_prompts)
    report["config"] = config.record()
    write_report(report, report_path.parent)
    return report["certificate"], report_path
