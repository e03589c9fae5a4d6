"""The `draftzoo` command line: each handler parses, calls one package function, prints.

draftzoo testbed build --size tiny --output-dir runs/testbed-tiny
draftzoo testbed info
draftzoo target get smollm2-135m-instruct
draftzoo user-turns --target smollm2-135m-instruct --count 1000 --output turns.jsonl
draftzoo train recipes/draft_lm/testbed-small.yaml [--set train.max_steps=10]
draftzoo capture recipes/draft_lm/testbed-small.yaml --dir runs/capture
draftzoo generate --drafter eagle3-testbed-small --tree --prompt 'def add(a, b):'
draftzoo generate --drafter runs/medusa1-testbed-small --tree --prompt 'def add(a, b):'
draftzoo eval runs/eagle3-testbed-small --prompts 20 --temperatures 0 1 --output-dir runs/e3-eval
draftzoo publish runs/eagle3-testbed-small --report runs/e3-eval/report.json
draftzoo zoo list
draftzoo export eagle3-testbed-small --format vllm --output-dir exports/e3-vllm
draftzoo demo
accelerate launch --config_file recipes/launch/ddp.yaml -m draftzoo train RECIPE
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from draftzoo.architectures.config_io import ConfigError
from draftzoo.cli_parser import build_parser as _build_parser
from draftzoo.cli_parser import device as _device
from draftzoo.cli_targets import TARGET_HANDLERS

logger = logging.getLogger("draftzoo")


def _proposer(args: argparse.Namespace, what: str):
    """(the model-free proposer the flags picked with its settings, or None; the proposal
    settings they ask for), checked before anything loads."""
    from draftzoo.inference.model_free import picked
    from draftzoo.inference.proposal_settings import from_flags
    from draftzoo.inference.proposer import ProposerError
    from draftzoo.inference.proposers.suffix_decoding import MODEL_FREE_SPEC as SUFFIX
    from draftzoo.inference.proposers.suffix_store import check_cache_path

    model_free = picked(args, what, shared={SUFFIX.name: "--hybrid"})
    settings = from_flags(args, what, SUFFIX.settings_from(args) if args.hybrid else None)
    if model_free is not None:
        try:
            model_free[0].check(settings)
        except ProposerError as err:
            raise ConfigError(f"{what}: {err}") from err
    cache_path = getattr(args, "suffix_cache", None)
    if cache_path:
        check_cache_path(Path(cache_path))
    return model_free, settings


def _generate(args: argparse.Namespace) -> int:
    from draftzoo.inference.cache_settings import CacheSettings
    from draftzoo.inference.load import build_generator
    from draftzoo.inference.sampling import SamplingParams

    model_free, proposal = _proposer(args, "draftzoo generate")
    if (proposal.drafts_tree or proposal.hybrid) and not (args.drafter or model_free):
        raise ConfigError(f"draftzoo generate: a {proposal.kind} proposal needs --drafter DRAFTER")
    params = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        stop_strings=tuple(args.stop),
        seed=args.seed,
        acceptance=args.acceptance,
    )
    generator = build_generator(
        args.target,
        drafter=args.drafter,
        draft_model=args.draft,
        model_free=model_free,
        proposal=proposal,
        device=_device(args.device),
        cache=CacheSettings(
            static=args.static_cache,
            max_length=args.max_cache_length,
            cpu_kernels=False if args.stock_kernels else None,
        ),
    )
    out = generator.generate(args.prompt, params)
    print(args.prompt + out.text)
    print(f"--- finish: {out.finish_reason}")
    if params.lossy:
        print("--- LOSSY: typical acceptance; this output is not distributed as the target's")
    for key, value in out.metrics.summary().items():
        print(f"{key}: {value}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from draftzoo.architectures.output_folders import refuse_inputs_inside
    from draftzoo.train.registry import load_recipe, run_recipe

    recipe = load_recipe(args.recipe, args.set)
    if args.check:
        return _check_recipe(recipe)
    # the recipe file is read again by each resume: never inside the folder a run replaces
    refuse_inputs_inside(Path(recipe.output_dir), (args.recipe,))
    result = run_recipe(recipe)
    from draftzoo.train.distributed import partial_state

    if partial_state().is_main_process:
        print(f"drafter: {result.output_dir}")
        print(f"steps: {result.steps} (resumed from step {result.resumed_from})")
        print(f"supervised tokens: {result.supervised_tokens}")
        print(f"passes over the training rows: {result.data_passes:.3g}")
        print(f"final loss: {result.final_loss:.4f}")
        print(f"top-1 agreement (first draft position): {result.top1_agreement:.4f}")
        print(f"train seconds: {result.train_seconds:.1f}")
    return 0


def _check_recipe(recipe) -> int:
    from draftzoo.train.registry import check_recipe

    summary = check_recipe(recipe)
    print(f"recipe {recipe.name}: valid (checked on the meta device, no weights loaded)")
    for key, value in summary.items():
        print(f"{key}: {value:,}" if isinstance(value, int) else f"{key}: {value}")
    return 0


def _regenerate(args: argparse.Namespace) -> int:
    from draftzoo.data.regenerate import RegenerateConfig, record_answer_report, training_window
    from draftzoo.train.recipe_jobs import regenerate_for_recipe
    from draftzoo.train.registry import load_recipe

    recipe = load_recipe(args.recipe, args.set)
    config = RegenerateConfig(  # checked before anything is loaded or written
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        seed=args.seed,
        limit=args.limit,
        sort_window=args.sort_window,
        window=None if args.whole_conversations else training_window(recipe.data),
    )
    written, report = regenerate_for_recipe(recipe, Path(args.output), config, args.writer)
    print(f"data: {report.summary()}")
    if report.capped:
        print(f"capped: {report.capped} answers cut to the room the writer's context leaves")
    if report.beyond_window:
        print(
            f"beyond the training window ({config.window} tokens): {report.beyond_window} "
            "assistant turns not written"
        )
    print(f"wrote {written} regenerated rows to {args.output}")
    print(f"answers: {record_answer_report(Path(args.output)).summary()}")
    return 0


def _capture(args: argparse.Namespace) -> int:
    from draftzoo.train.recipe_jobs import capture_for_recipe
    from draftzoo.train.registry import load_recipe

    recipe = load_recipe(args.recipe, args.set)
    out_dir = Path(args.dir) if args.dir else None
    summary = capture_for_recipe(recipe, out_dir, args.layer, announce=print)
    print(
        f"captured {summary.rows} rows in {summary.shards} shard(s), "
        f"{summary.bytes_per_token} bytes per token"
    )
    return 0


def _set_threads(threads: int | None) -> None:
    """`--threads N` (0 or absent: torch's default)."""
    if not threads:
        return
    if threads < 0:
        raise ConfigError(f"--threads must be >= 0 (0: the default), got {threads}")
    import torch

    torch.set_num_threads(threads)


def _eval_config(args: argparse.Namespace, proposal):
    """The `EvalConfig` the `draftzoo eval` flags describe; a contradiction is a ConfigError."""
    from draftzoo.eval.runner import EvalConfig

    try:
        return EvalConfig(
            prompt_sets=tuple(args.prompt_set or ["humaneval"]),
            max_prompts=args.prompts,
            heldout_from=tuple(args.heldout_from or ()),
            max_new_tokens=args.max_new_tokens,
            temperatures=tuple(args.temperatures),
            batch_sizes=tuple(args.batch_sizes),
            repeats=args.repeats,
            proposal=proposal,
            acceptance=args.acceptance,
            chat=not args.raw,
            seed=args.seed,
            static_cache=args.static_cache,
            cpu_kernels=False if args.stock_kernels else None,
            max_cache_length=args.max_cache_length,
            teacher_forced=args.teacher_forced,
            position_edges=tuple(args.position_edges),
            certificate_samples=args.certificate_samples,
            certificate_prompts=args.certificate_prompts,
            dtype=args.dtype,
        )
    except ValueError as err:  # said before anything loads
        raise ConfigError(f"draftzoo eval: {err}") from err


def _eval(args: argparse.Namespace) -> int:
    from draftzoo.eval.measure import measure_drafter, measure_model_free
    from draftzoo.eval.runner import summary_text

    _set_threads(args.threads)
    output_dir = Path(args.output_dir) if args.output_dir else None
    model_free, proposal = _proposer(args, "draftzoo eval")
    if model_free is not None and args.drafter is not None:
        raise ConfigError("draftzoo eval: a drafter or a model-free proposer, not both")
    if model_free is None and args.drafter is None:
        raise ConfigError(f"draftzoo eval: name a drafter, or {_model_free_flags()}")
    config = _eval_config(args, proposal)
    if model_free is not None:
        spec, settings = model_free
        runtime = spec.build(settings, proposal)
        report, path = measure_model_free(
            runtime, config, args.target, _device(args.device), output_dir
        )
    else:
        report, path = measure_drafter(
            args.drafter, config, args.target, _device(args.device), output_dir
        )
    print(summary_text(report))
    print(f"report: {path}")
    return 0


def _model_free_flags() -> str:
    from draftzoo.inference.model_free import model_free_specs

    return " or ".join(spec.flag for spec in model_free_specs().values())


def _certify(args: argparse.Namespace) -> int:
    """Add (or redo) the losslessness certificate in a drafter's eval report."""
    from draftzoo.eval.certificate import describe
    from draftzoo.eval.measure import certify_report

    _set_threads(args.threads)
    certificate, path = certify_report(
        args.drafter, args.report, args.samples, args.prompts, args.target
    )
    print(describe(certificate))
    print(f"report: {path}")
    return 0 if certificate["passed"] else 1


def _publish(args: argparse.Namespace) -> int:
    from draftzoo.architectures.zoo_index import default_zoo_dir
    from draftzoo.eval.publish import publish, push_to_hub

    zoo = Path(args.zoo) if args.zoo else default_zoo_dir()
    folder = publish(
        args.drafter, args.report, zoo, args.name, args.overwrite, args.allow_unreliable_timing
    )
    print(f"published: {folder} (zoo index {zoo / 'index.json'})")
    if args.push_to_hub:
        print(f"pushed: {push_to_hub(folder, args.push_to_hub, args.private)}")
    return 0


def _zoo_build(args: argparse.Namespace) -> int:
    from draftzoo.architectures.zoo_index import default_zoo_dir
    from draftzoo.zoo_build import BuildPlan, build_entry, recipe_for

    model_free, proposal = _proposer(args, "draftzoo zoo build")
    if model_free is not None:
        raise ConfigError("draftzoo zoo build: it measures the drafter it trains, not a proposer")
    config = _eval_config(args, proposal)
    _set_threads(args.threads)
    plan = BuildPlan(
        recipe=args.recipe or recipe_for(args.family, args.target),
        overrides=tuple(args.set),
        work=args.work,
        zoo=Path(args.zoo) if args.zoo else default_zoo_dir(),
        config=config,
        name=args.name,
        device=_device(args.device),
        allow_unreliable_timing=args.allow_unreliable_timing,
    )
    print(build_entry(plan))
    return 0


def _zoo_list(args: argparse.Namespace) -> int:
    from draftzoo.architectures.zoo_index import (
        ZooIndex,
        builtin_zoo_dir,
        default_zoo_dir,
        entry_line,
    )

    zoos = [Path(args.zoo)] if args.zoo else [default_zoo_dir(), builtin_zoo_dir()]
    for root in zoos:
        entries = ZooIndex(root).entries()
        print(f"{root} ({len(entries)} drafters)")
        for name, entry in entries.items():
            print(entry_line(name, entry))
    return 0


def _leaderboard(args: argparse.Namespace) -> int:
    """Rank drafters from their reports: markdown to stdout, files to --output-dir."""
    from draftzoo.architectures.zoo_index import builtin_zoo_dir, default_zoo_dir
    from draftzoo.eval import leaderboard

    zoos = [Path(z) for z in args.zoo or []]
    if not zoos and not args.report:
        zoos = [default_zoo_dir(), builtin_zoo_dir()]
    rows = leaderboard.collect_rows(zoos, args.report, args.references, args.target)
    title = f"Leaderboard: {args.target or 'every target'}"
    print(leaderboard.render(rows, title, plot=None))
    if args.output_dir:
        for written in leaderboard.write(rows, Path(args.output_dir), title):
            print(f"written: {written}")
    if args.readme:
        leaderboard.update_readme(args.readme, rows)
        print(f"updated: {args.readme}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from draftzoo.architectures.export import describe_export, export_for_target
    from draftzoo.architectures.gguf_settings import GgufSettings

    out = export_for_target(
        args.drafter,
        Path(args.output_dir),
        args.format,
        args.target,
        check_target=not args.no_target_check,
        verifier=args.verifier,
        speculative_tokens=args.num_speculative_tokens,
        embed_tokens=args.embed_tokens,
        gguf=GgufSettings(args.llama_cpp, args.gguf_type),
    )
    print(f"exported: {out} ({args.format})")
    for line in describe_export(out):
        print(f"  {line}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from draftzoo.architectures.drafter_io import read_drafter_record
    from draftzoo.inference.peer_import import import_drafter

    out = import_drafter(Path(args.source), Path(args.output_dir), args.target)
    imported = read_drafter_record(out)["imported"]
    print(f"imported: {out} ({imported['layout']} -> {read_drafter_record(out)['family']})")
    for note in imported["notes"]:
        print(f"  {note}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    """prepare data -> train -> eval beside the shipped drafter -> publish -> load -> generate."""
    from draftzoo.demo import run_demo

    return run_demo(Path(args.output_dir), args.steps, args.prompts)


HANDLERS = {
    **TARGET_HANDLERS,
    "generate": _generate,
    "train": _train,
    "regenerate": _regenerate,
    "capture": _capture,
    "eval": _eval,
    "certify": _certify,
    "publish": _publish,
    "zoo_list": _zoo_list,
    "zoo_build": _zoo_build,
    "leaderboard": _leaderboard,
    "export": _export,
    "import": _import,
    "demo": _demo,
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand, each bound to its handler."""
    return _build_parser(HANDLERS)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `draftzoo` command."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # --help (0), or a refused argument line (2, said in one line)
        return stop.code if isinstance(stop.code, int) else 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from draftzoo.architectures.errors import DraftzooError
    from draftzoo.architectures.safe_load import ALLOW_PICKLE_ENV

    if args.allow_pickle:
        os.environ[ALLOW_PICKLE_ENV] = "1"  # for this process and the workers it launches
    try:
        return args.func(args)
    except (DraftzooError, OSError) as err:  # bad input or a file that is not there
        if args.verbose:
            raise
        print(f"draftzoo: error: {_one_line(err)}", file=sys.stderr)
        return 2
    finally:
        _close_process_group()


def _close_process_group() -> None:
    """Leave a distributed run's process group before exit (a gloo group left open at
    interpreter exit aborts the process)."""
    torch = sys.modules.get("torch")
    if (
        torch is not None
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
    ):
        torch.distributed.destroy_process_group()


def _one_line(err: Exception) -> str:
    """An error's message on one line (a missing file names the file)."""
    if isinstance(err, OSError) and err.filename is not None:
        return f"{err.strerror or type(err).__name__}: {err.filename}"
    return " ".join(str(err).split()) or type(err).__name__


if __name__ == "__main__":
    sys.exit(main())
