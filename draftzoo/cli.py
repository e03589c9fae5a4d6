"""The `draftzoo` command line.

draftzoo testbed build --size tiny --output-dir runs/testbed-tiny
draftzoo testbed info
draftzoo train recipes/draft_lm/testbed-small.yaml [--set train.max_steps=10]
draftzoo capture recipes/draft_lm/testbed-small.yaml --dir runs/capture
draftzoo generate --eagle runs/eagle3-testbed-small --tree --prompt 'def add(a, b):'
draftzoo generate --medusa runs/medusa1-testbed-small --tree --prompt 'def add(a, b):'
draftzoo eval runs/eagle3-testbed-small --prompts 20 --temperatures 0 1 --output-dir runs/e3-eval
draftzoo publish runs/eagle3-testbed-small --report runs/e3-eval/report.json
draftzoo zoo list
draftzoo export eagle3-testbed-small --format vllm --output-dir exports/e3-vllm
draftzoo demo
accelerate launch --config_file recipes/launch/ddp.yaml -m draftzoo train RECIPE
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from draftzoo.architectures.config_io import ConfigError
from draftzoo.architectures.defaults import (
    ANSWER_MAX_NEW_TOKENS,
    CERTIFICATE_PROMPTS,
    CERTIFICATE_SAMPLES,
    COMMITTED_TARGET,
    MAX_NEW_TOKENS,
    NUM_SPECULATIVE_TOKENS,
    TEMPERATURE,
    target_location,
)

logger = logging.getLogger("draftzoo")


def _testbed_build(args: argparse.Namespace) -> int:
    from draftzoo.eval.lm_quality import measure_continuations
    from draftzoo.train.distributed import partial_state
    from draftzoo.train.testbed import (
        build_testbed,
        default_cache_dir,
        load_testbed_config,
        write_record,
    )
    from draftzoo.train.testbed_data import load_tokens, prepare_testbed_data

    config = load_testbed_config(args.config or args.size)
    output_dir = Path(args.output_dir or f"runs/{config.name}")
    cache_dir = args.cache_dir or default_cache_dir()
    record = build_testbed(config, output_dir, cache_dir)
    if partial_state().is_main_process:
        heldout = load_tokens(prepare_testbed_data(config, cache_dir).heldout_tokens)
        record["greedy"] = measure_continuations(
            output_dir, max_new_tokens=args.quality_tokens, reference_tokens=heldout
        )
        write_record(output_dir, record)
        _print_testbed(output_dir, record)
    return 0


def _print_testbed(path: Path, record: dict) -> None:
    print(f"testbed:           {record['name']}  ({path})")
    print(f"parameters:        {record['parameters'] / 1e6:.2f}M")
    print(
        f"training tokens:   {record['training_tokens'] / 1e6:.1f}M "
        f"({record['training_steps']} steps, {record['processes']} process(es))"
    )
    print(
        f"held-out loss:     {record['heldout_loss']:.3f} nats "
        f"(unigram {record['unigram_loss']:.3f}, ratio {record['loss_ratio']:.3f})"
    )
    greedy = record.get("greedy")
    if greedy:
        print(
            f"greedy repeated-4-gram share: {greedy['repeated_4gram_share']:.3f} over "
            f"{greedy['prompts']} HumanEval prompts x {greedy['max_new_tokens']} tokens"
        )
        if "heldout_code_repeated_4gram_share" in greedy:
            share = greedy["heldout_code_repeated_4gram_share"]
            print(f"  real held-out code windows of that length: {share:.3f}")


def _testbed_export_chat(args: argparse.Namespace) -> int:
    from draftzoo.data.testbed_chat import export_testbed_chat

    count = export_testbed_chat(Path(args.output), args.max_rows)
    print(f"{count} conversations of testbed-chat -> {args.output}")
    return 0


def _testbed_info(args: argparse.Namespace) -> int:
    from draftzoo.train.testbed import committed_testbed_dir, read_record

    path = Path(args.path) if args.path else committed_testbed_dir()
    record = read_record(path)
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        _print_testbed(path, record)
    return 0


def _generate(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoTokenizer

    from draftzoo.architectures.safe_load import load_causal_lm
    from draftzoo.inference.generate import SpeculativeGenerator
    from draftzoo.inference.load import load_drafter
    from draftzoo.inference.proposers import DraftModelProposer, PromptLookupProposer
    from draftzoo.inference.sampling import SamplingParams

    if args.tree and not (args.eagle or args.medusa):
        raise ConfigError("--tree needs --eagle DRAFTER or --medusa DRAFTER")
    params = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        stop_strings=tuple(args.stop),
        seed=args.seed,
        acceptance=args.acceptance,
    )
    target_path = target_location(args.target or COMMITTED_TARGET)
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    device = _device(args.device)
    target = load_causal_lm(target_path, dtype=torch.float32).to(device)
    proposer = None
    if args.prompt_lookup:
        proposer = PromptLookupProposer(args.min_ngram, args.max_ngram)
    elif args.draft:
        draft = load_causal_lm(args.draft, dtype=torch.float32).to(device)
        proposer = DraftModelProposer(
            draft,
            AutoTokenizer.from_pretrained(args.draft),
            tokenizer,
            static_cache=args.static_cache,
        )
    elif args.eagle or args.medusa:
        proposer = _tree_proposer(args, target, tokenizer)
    elif args.mtp:
        runtime = load_drafter(
            Path(args.mtp),
            target,
            tokenizer,
            "chain",
            args.num_speculative_tokens,
            static_cache=args.static_cache,
        )
        proposer = runtime.make_proposer()
    generator = SpeculativeGenerator(
        target, tokenizer, proposer, args.num_speculative_tokens, static_cache=args.static_cache
    )
    out = generator.generate(args.prompt, params)
    print(args.prompt + out.text)
    print(f"--- finish: {out.finish_reason}")
    if params.lossy:
        print("--- LOSSY: typical acceptance; this output is not distributed as the target's")
    for key, value in out.metrics.summary().items():
        print(f"{key}: {value}")
    return 0


def _tree_proposer(args: argparse.Namespace, target, tokenizer):
    """An EAGLE or Medusa proposer from --eagle / --medusa, drafting trees with --tree (a
    Medusa-2 drafter merges its adapter into `target`)."""
    from draftzoo.inference.eagle import EagleProposer, TreeSettings
    from draftzoo.inference.load import load_drafter

    tree = None
    if args.tree:
        tree = TreeSettings(
            args.tree_top_k, args.tree_depth, args.tree_tokens, args.tree_sampled_children
        )
    if args.eagle:
        drafter = EagleProposer.from_pretrained(args.eagle, target, tokenizer).drafter
        return EagleProposer(drafter, tree, static_cache=args.static_cache)
    proposal = "tree" if tree is not None else "chain"
    chain_length = args.num_speculative_tokens if proposal == "chain" else None
    runtime = load_drafter(
        Path(args.medusa), target, tokenizer, proposal, chain_length, tree, args.static_cache
    )
    return runtime.make_proposer()


def _train(args: argparse.Namespace) -> int:
    from draftzoo.train.registry import load_recipe, run_recipe

    recipe = load_recipe(args.recipe, args.set)
    if args.check:
        return _check_recipe(recipe)
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
    from draftzoo.data.regenerate import RegenerateConfig, regenerate
    from draftzoo.train.distributed import partial_state
    from draftzoo.train.registry import load_recipe
    from draftzoo.train.setup import load_target

    recipe = load_recipe(args.recipe, args.set)
    config = RegenerateConfig(  # checked before anything is loaded or written
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        seed=args.seed,
        limit=args.limit,
        sort_window=args.sort_window,
    )
    # a writer named by a path that is not there is refused before anything is loaded
    writer_location = target_location(args.writer) if args.writer else None
    target = load_target(recipe.target, partial_state().device)
    writer = None
    if args.writer:
        import torch
        from transformers import AutoTokenizer

        from draftzoo.architectures.safe_load import load_causal_lm
        from draftzoo.architectures.target import TargetError, tokenizer_hash

        if tokenizer_hash(AutoTokenizer.from_pretrained(writer_location)) != tokenizer_hash(
            target.tokenizer
        ):
            raise TargetError(f"--writer {args.writer} does not share the target's tokenizer")
        writer = load_causal_lm(writer_location, dtype=torch.float32)
        writer = writer.to(target.model.device).eval()
    written, report = regenerate(target, recipe.data, Path(args.output), config, writer)
    print(f"data: {report.summary()}")
    if report.capped:
        print(f"capped: {report.capped} answers cut to the room the writer's context leaves")
    print(f"wrote {written} regenerated rows to {args.output}")
    return 0


def _capture(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from draftzoo.data.capture import CaptureConfig, capture_offline, estimate_bytes
    from draftzoo.train.distributed import partial_state
    from draftzoo.train.registry import load_recipe
    from draftzoo.train.setup import cache_dir_of, load_target, prepare_dataset

    recipe = load_recipe(args.recipe, args.set)
    out_dir = Path(args.dir or recipe.capture.dir or "")
    if not str(out_dir) or str(out_dir) == ".":
        raise ConfigError("give --dir or set capture.dir in the recipe")
    state = partial_state()
    target = load_target(recipe.target, state.device)
    dataset, report, data_hash = prepare_dataset(
        recipe.data, target.tokenizer, cache_dir_of(recipe), state
    )
    layers = sorted(set(args.layer or recipe.capture_layers(target.num_layers)))
    config = replace(recipe.capture, mode="offline", dir=str(out_dir))
    need = estimate_bytes(
        dataset, target.hidden_size, layers, CaptureConfig(dtype=config.dtype).torch_dtype
    )
    print(f"data: {report.summary()}")
    print(
        f"disk estimate: {need / 1e9:.3f} GB for {len(dataset)} rows, layers {layers} -> {out_dir}"
    )
    index = capture_offline(
        target, dataset, layers, out_dir, config, data_hash, target.tokenizer.pad_token_id or 0
    )
    rows = sum(shard["count"] for shard in index["shards"])
    print(f"captured {rows} rows in {len(index['shards'])} shard(s)")
    return 0


def _device(name: str | None) -> str:
    """The device asked for, else cuda when there is one, else cpu."""
    import torch

    return name or ("cuda" if torch.cuda.is_available() else "cpu")


def _eval_config(args: argparse.Namespace):
    """The `EvalConfig` the `draftzoo eval` flags describe; a contradiction is a ConfigError."""
    from draftzoo.eval.runner import EvalConfig

    try:
        return EvalConfig(
            prompt_sets=tuple(args.prompt_set or ["humaneval"]),
            max_prompts=args.prompts,
            max_new_tokens=args.max_new_tokens,
            temperatures=tuple(args.temperatures),
            batch_sizes=tuple(args.batch_sizes),
            repeats=args.repeats,
            proposal="tree" if args.tree else "chain",
            num_speculative_tokens=args.num_speculative_tokens,
            tree_top_k=args.tree_top_k,
            tree_depth=args.tree_depth,
            tree_tokens=args.tree_tokens,
            tree_sampled_children=args.tree_sampled_children,
            acceptance=args.acceptance,
            chat=not args.raw,
            seed=args.seed,
            static_cache=args.static_cache,
            teacher_forced=args.teacher_forced,
            position_edges=tuple(args.position_edges),
            certificate_samples=args.certificate_samples,
            certificate_prompts=args.certificate_prompts,
        )
    except ValueError as err:  # said before anything loads
        raise ConfigError(f"draftzoo eval: {err}") from err


def _load_as_configured(folder: Path, target, tokenizer, config):
    """The drafter loaded as an `EvalConfig` serves it."""
    from draftzoo.inference.load import load_drafter

    return load_drafter(
        folder,
        target,
        tokenizer,
        config.proposal,
        config.num_speculative_tokens,
        config.tree,
        config.static_cache,
    )


def _eval(args: argparse.Namespace) -> int:
    from draftzoo.eval.plots import plot_report
    from draftzoo.eval.runner import evaluate, summary_text, write_report
    from draftzoo.inference.load import load_target, recorded_target, resolve_drafter

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    config = _eval_config(args)
    folder, _ = resolve_drafter(args.drafter)
    from draftzoo.architectures.drafter_io import read_drafter_record
    from draftzoo.architectures.eagle import KINDS as EAGLE_KINDS

    record = read_drafter_record(folder)
    if config.teacher_forced and record["family"] not in EAGLE_KINDS:
        raise ConfigError(
            f"--teacher-forced scores EAGLE drafters; {folder} is a {record['family']} drafter"
        )
    target_name = args.target or recorded_target(record)
    target, tokenizer = load_target(target_name, device=_device(args.device))
    adapts_target = record["family"] == "medusa2"
    if adapts_target:  # the original target's greedy answers, before the adapter is merged
        original = _greedy_answers(target, tokenizer, config)
    drafter = _load_as_configured(folder, target, tokenizer, config)
    report = evaluate(target, tokenizer, drafter, config, target_name)
    if adapts_target:
        from draftzoo.eval.target_drift import drift_section, greedy_agreement

        agreement = greedy_agreement(original, _greedy_answers(target, tokenizer, config))
        report["target_drift"] = drift_section(record, agreement)
    output_dir = Path(args.output_dir or f"runs/eval-{folder.name}")
    path = write_report(report, output_dir)
    plot_report(report, output_dir)
    print(summary_text(report))
    print(f"report: {path}")
    return 0


def _certify(args: argparse.Namespace) -> int:
    """Add (or redo) the losslessness certificate in a drafter's eval report."""
    from dataclasses import asdict, replace

    from draftzoo.architectures.drafter_io import checkpoint_hash, read_drafter_record
    from draftzoo.eval.certificate import describe
    from draftzoo.eval.publish import read_report
    from draftzoo.eval.runner import (
        REPORT_FILE,
        EvalConfig,
        certificate_of,
        load_prompts,
        write_report,
    )
    from draftzoo.inference.load import load_target, recorded_target, resolve_drafter

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    report_path = args.report / REPORT_FILE if args.report.is_dir() else args.report
    if report_path.name != REPORT_FILE:
        raise ConfigError(f"--report: give an eval's {REPORT_FILE} or its folder: {report_path}")
    report = read_report(report_path)
    folder, _ = resolve_drafter(args.drafter)
    if report.get("checkpoint", {}).get("sha256") != checkpoint_hash(folder):
        raise ConfigError(f"{report_path} measured another checkpoint than {folder}")
    try:
        config = replace(
            EvalConfig.from_report(report),
            certificate_samples=args.samples,
            certificate_prompts=args.prompts,
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"draftzoo certify: {report_path}: {err}") from err
    if not config.certificate_samples:
        raise ConfigError("draftzoo certify: --samples must be >= 1")
    record = read_drafter_record(folder)
    target, tokenizer = load_target(args.target or recorded_target(record))
    drafter = _load_as_configured(folder, target, tokenizer, config)
    prompts = load_prompts(config)[1:]
    report["certificate"] = certificate_of(target, tokenizer, drafter, config, prompts)
    report["config"] = asdict(config)
    write_report(report, report_path.parent)
    print(describe(report["certificate"]))
    print(f"report: {report_path}")
    return 0 if report["certificate"]["passed"] else 1


def _greedy_answers(target, tokenizer, config) -> list[list[int]]:
    """Target-only greedy continuations of the evaluation's prompts (warm-up excluded)."""
    from draftzoo.eval.runner import load_prompts
    from draftzoo.eval.target_drift import greedy_tokens

    texts = [p.render(tokenizer, config.chat) for p in load_prompts(config)[1:]]
    return greedy_tokens(target, tokenizer, texts, config.max_new_tokens)


def _publish(args: argparse.Namespace) -> int:
    from draftzoo.architectures.zoo_index import default_zoo_dir
    from draftzoo.eval.publish import publish, push_to_hub

    zoo = Path(args.zoo) if args.zoo else default_zoo_dir()
    folder = publish(args.drafter, args.report, zoo, args.name, args.overwrite)
    print(f"published: {folder} (zoo index {zoo / 'index.json'})")
    if args.push_to_hub:
        print(f"pushed: {push_to_hub(folder, args.push_to_hub, args.private)}")
    return 0


def _zoo_list(args: argparse.Namespace) -> int:
    from draftzoo.architectures.zoo_index import ZooIndex, builtin_zoo_dir, default_zoo_dir

    zoos = [Path(args.zoo)] if args.zoo else [default_zoo_dir(), builtin_zoo_dir()]
    for root in zoos:
        entries = ZooIndex(root).entries()
        print(f"{root} ({len(entries)} drafters)")
        for name, entry in entries.items():
            metrics = "; ".join(
                f"{key} tau {m['tau']:.2f} speedup {m['speedup']:.2f}x"
                for key, m in entry["metrics"].items()
            )
            certified = "certified" if (entry.get("certificate") or {}).get("passed") else "-"
            line = f"  {name:28} {entry['family']:9} {entry['base_model']:20} {metrics}"
            print(f"{line}; {certified}")
    return 0


def _leaderboard(args: argparse.Namespace) -> int:
    """Rank drafters from their reports: markdown to stdout, files to --output-dir."""
    from draftzoo.architectures.zoo_index import builtin_zoo_dir, default_zoo_dir
    from draftzoo.eval import leaderboard

    zoos = [Path(z) for z in args.zoo or []]
    if not zoos and not args.report:
        zoos = [default_zoo_dir(), builtin_zoo_dir()]
    rows = [row for zoo in zoos for row in leaderboard.rows_from_zoo(zoo, args.target)]
    for path in args.report:
        report = json.loads(path.read_text()) if path.is_file() else None
        if report is None or "results" not in report:
            raise ConfigError(f"--report {path}: not an eval report")
        if args.target and report["target"]["name"] != args.target:
            continue
        folder = Path(report["checkpoint"]["path"])
        here = folder if folder.is_dir() else None
        rows.append(leaderboard.row_from_report(report, folder.name, here))
    if args.references:
        rows += leaderboard.rows_from_references(args.references)
    if not rows:
        raise ConfigError("no drafters to rank: name a --zoo with entries or a --report")
    title = f"Leaderboard: {args.target or 'every target'}"
    print(leaderboard.render(rows, title, plot=None))
    if args.output_dir:
        for written in leaderboard.write(rows, Path(args.output_dir), title):
            print(f"written: {written}")
    if args.readme:
        text = args.readme.read_text()
        try:
            updated = leaderboard.replace_block(text, leaderboard.families_block(rows))
        except ValueError as err:
            raise ConfigError(f"--readme {args.readme}: {err}") from err
        args.readme.write_text(updated)
        print(f"updated: {args.readme}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from draftzoo.architectures.drafter_io import read_drafter_record
    from draftzoo.architectures.export import describe_export, export_drafter
    from draftzoo.inference.load import recorded_target, resolve_drafter

    folder, _ = resolve_drafter(args.drafter)
    target_name = args.target or recorded_target(read_drafter_record(folder))
    target_config = None
    if not args.no_target_check:
        from transformers import AutoConfig

        target_config = AutoConfig.from_pretrained(target_location(target_name))
    out = export_drafter(
        folder,
        Path(args.output_dir),
        args.format,
        target_config,
        verifier=args.verifier,
        speculative_tokens=args.num_speculative_tokens,
        target=target_name,
        embed_tokens=args.embed_tokens,
    )
    print(f"exported: {out} ({args.format})")
    for line in describe_export(out):
        print(f"  {line}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    """prepare data -> train -> eval beside the shipped drafter -> publish -> load -> generate."""
    from draftzoo.demo import run_demo

    return run_demo(Path(args.output_dir), args.steps, args.prompts)


def _add_acceptance(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--acceptance",
        choices=("exact", "typical"),
        default="exact",
        help="exact (default): lossless, the output is distributed as the target's; typical: "
        "Medusa's typical acceptance, LOSSY at T > 0 (keeps draft tokens the target finds "
        "typical enough; faster, but the output is no longer the target's distribution)",
    )


def _add_certificate_options(parser: argparse.ArgumentParser, samples: str, prompts: str) -> None:
    """The losslessness certificate's size (defaults: `CertificateConfig`)."""
    parser.add_argument(
        samples,
        type=int,
        default=CERTIFICATE_SAMPLES,
        help="losslessness certificate: sampled decodes per prompt at T = 1 (0 = none; "
        "publish refuses a report without a passed certificate)",
    )
    parser.add_argument(
        prompts,
        type=int,
        default=CERTIFICATE_PROMPTS,
        help="losslessness certificate: prompts it samples",
    )


def _add_tree_options(parser: argparse.ArgumentParser) -> None:
    """The EAGLE tree budget (`TreeSettings`), for --tree."""
    parser.add_argument("--tree-top-k", type=int, default=10, help="EAGLE-2: children per node")
    parser.add_argument("--tree-depth", type=int, default=6, help="EAGLE-2: maximum depth")
    parser.add_argument("--tree-tokens", type=int, default=60, help="EAGLE-2: draft tokens kept")
    parser.add_argument(
        "--tree-sampled-children",
        type=int,
        default=3,
        help="T > 0 trees: children sampled (without replacement) per expanded node",
    )


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe field, e.g. --set train.max_steps=10 (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="draftzoo", description="Train, measure and serve speculative-decoding drafters."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="also load model weights stored as a pickle (pytorch_model.bin), which can run "
        "code: only for files you trust (default: safetensors only)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    testbed = commands.add_parser(
        "testbed", help="the small trained target that tests, demos and benchmarks use"
    )
    testbed_commands = testbed.add_subparsers(dest="testbed_command", required=True)
    build = testbed_commands.add_parser(
        "build",
        help="build a testbed target from local Python source",
        description="Build the corpus and tokenizer, pretrain the target, measure it. "
        "Use both CPU cores through DDP with: ACCELERATE_USE_CPU=1 accelerate launch "
        "--multi_gpu --num_processes 2 -m draftzoo.cli testbed build --size small",
    )
    build.add_argument("--size", default="tiny", help="testbed size: tiny or small (default tiny)")
    build.add_argument("--config", help="a testbed recipe YAML instead of --size")
    build.add_argument("--output-dir", help="where the target goes (default runs/<name>)")
    build.add_argument(
        "--cache-dir",
        type=Path,
        help="prepared data and checkpoints "
        "(default $DRAFTZOO_CACHE/testbed or ~/.cache/draftzoo/testbed)",
    )
    build.add_argument(
        "--quality-tokens",
        type=int,
        default=MAX_NEW_TOKENS,
        help="tokens per greedy continuation when measuring repetition",
    )
    build.set_defaults(func=_testbed_build)

    info = testbed_commands.add_parser(
        "info", help="print what a built testbed is (default: the committed testbed-small)"
    )
    info.add_argument("path", nargs="?", help="a built testbed folder")
    info.add_argument("--json", action="store_true", help="print the whole record as JSON")
    info.set_defaults(func=_testbed_info)

    export_chat = testbed_commands.add_parser(
        "export-chat",
        help="write the testbed-chat conversations to a .jsonl file (a data.source)",
        description="testbed-chat reads the installed Python and packages; on a machine with "
        "other versions, train on this file instead (--set data.source=FILE).",
    )
    export_chat.add_argument("output", help="the .jsonl file to write")
    export_chat.add_argument("--max-rows", type=int, help="only the first N conversations")
    export_chat.set_defaults(func=_testbed_export_chat)

    gen = commands.add_parser(
        "generate",
        help="generate with the speculative runtime and print the text and its metrics",
        description="Target-only decoding unless --draft, --eagle, --medusa, --mtp or "
        "--prompt-lookup "
        "is given. "
        "Greedy at --temperature 0; sampling is lossless (rejection sampling).",
    )
    gen.add_argument("--target", help="target model folder (default: the committed testbed-small)")
    drafts = gen.add_mutually_exclusive_group()
    drafts.add_argument("--draft", help="a draft causal LM sharing the target's tokenizer")
    drafts.add_argument("--prompt-lookup", action="store_true", help="n-gram prompt-lookup drafts")
    drafts.add_argument("--eagle", help="an EAGLE-1 or EAGLE-3 drafter folder for this target")
    drafts.add_argument("--medusa", help="a Medusa heads folder for this target")
    drafts.add_argument("--mtp", help="an MTP modules folder for this target (chains)")
    gen.add_argument(
        "--tree",
        action="store_true",
        help="EAGLE: draft EAGLE-2 dynamic trees; Medusa: the tree its training calibrated on "
        "held-out rows, else the default static tree (16 nodes, cut to the heads' depth); "
        "instead of chains (--num-speculative-tokens then caps the "
        "tree depth)",
    )
    _add_tree_options(gen)
    gen.add_argument("--min-ngram", type=int, default=1, help="prompt lookup: shortest n-gram")
    gen.add_argument("--max-ngram", type=int, default=3, help="prompt lookup: longest n-gram")
    gen.add_argument("--prompt", required=True, help="the prompt text")
    gen.add_argument(
        "--num-speculative-tokens",
        type=int,
        help="fix gamma, the draft tokens per round (default: adaptive, chosen from the "
        "measured acceptance and draft/verify cost)",
    )
    gen.add_argument(
        "--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="tokens to generate at most"
    )
    gen.add_argument("--temperature", type=float, default=TEMPERATURE, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0, help="0 = no top-k cut")
    gen.add_argument("--top-p", type=float, default=1.0, help="1 = no nucleus cut")
    gen.add_argument("--seed", type=int, help="sampling seed")
    _add_acceptance(gen)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    gen.add_argument(
        "--static-cache",
        action="store_true",
        help="preallocated KV caches for the target and the drafter; on CUDA their decode "
        "forwards replay as CUDA graphs",
    )
    gen.set_defaults(func=_generate)

    train = commands.add_parser(
        "train",
        help="train a drafter from a recipe (one process, or under accelerate launch)",
        description="Train the drafter a recipe describes; relaunching the same command resumes "
        "from the newest complete checkpoint. Distribute with: accelerate launch --config_file "
        "recipes/launch/<topology>.yaml -m draftzoo train RECIPE (see recipes/launch/README.md).",
    )
    train.add_argument(
        "recipe", type=Path, help="a recipe YAML, e.g. recipes/draft_lm/testbed-small.yaml"
    )
    _add_overrides(train)
    train.add_argument(
        "--check",
        action="store_true",
        help="validate the recipe and build target and drafter on the meta device, then stop "
        "(hub targets use the configs shipped in recipes/model_configs when present)",
    )
    train.set_defaults(func=_train)

    regen = commands.add_parser(
        "regenerate",
        help="replace a recipe's assistant turns with the target's own answers (.jsonl out)",
        description="Reads the recipe's target and data; rerunning resumes after the last "
        "complete row. Train on the result with --set data.source=OUTPUT.",
    )
    regen.add_argument("recipe", type=Path, help="the recipe whose target and data to use")
    regen.add_argument("--output", required=True, help="the .jsonl to write (appended, resumable)")
    regen.add_argument(
        "--writer",
        help="a causal LM on the target's tokenizer that writes the answers instead of the "
        "target, e.g. a trained draft LM for on-policy distillation data",
    )
    regen.add_argument("--temperature", type=float, default=TEMPERATURE, help="0 = greedy")
    regen.add_argument("--top-p", type=float, default=1.0, help="nucleus cut when sampling")
    regen.add_argument(
        "--max-new-tokens",
        type=int,
        default=ANSWER_MAX_NEW_TOKENS,
        help="tokens per answer at most",
    )
    regen.add_argument("--batch-size", type=int, default=8, help="conversations per generate call")
    regen.add_argument("--seed", type=int, default=0, help="sampling seed")
    regen.add_argument("--limit", type=int, help="regenerate only the first N usable rows")
    regen.add_argument(
        "--sort-window",
        type=int,
        default=8,
        help="batches whose conversations are grouped by prompt length before generating "
        "(1 = source order); rows are written back in source order, window by window",
    )
    _add_overrides(regen)
    regen.set_defaults(func=_regenerate)

    capture = commands.add_parser(
        "capture",
        help="capture target hidden states into safetensors shards for offline training",
        description="Prints the disk estimate first; rerunning resumes, keeping every finished "
        "shard whose checksum matches. Train from the shards with capture.mode=offline.",
    )
    capture.add_argument("recipe", type=Path, help="the recipe whose data and target to capture")
    capture.add_argument("--dir", help="shard folder (default: the recipe's capture.dir)")
    capture.add_argument(
        "--layer",
        type=int,
        action="append",
        help="HF hidden-state index to store (repeatable; default: the final post-norm state)",
    )
    _add_overrides(capture)
    capture.set_defaults(func=_capture)
    _add_zoo_commands(commands)
    return parser


def _add_zoo_commands(commands) -> None:
    """eval, publish, zoo, export, demo."""
    ev = commands.add_parser(
        "eval",
        help="measure a drafter: tau, per-position acceptance, speedup, identity, memory",
        description="Target-only and speculative decoding on the same prompts in one process, "
        "interleaved; writes report.json, summary.txt and plots to --output-dir.",
    )
    ev.add_argument("drafter", help="a drafter folder or a zoo name")
    ev.add_argument("--target", help="target folder or hub name (default: the drafter's own)")
    ev.add_argument(
        "--prompt-set",
        action="append",
        help="humaneval, stdlib-heldout, a question .jsonl (MT-bench / Spec-Bench format), or "
        "hf:NAME[:SPLIT[:COLUMN]] (repeatable; default humaneval)",
    )
    ev.add_argument("--prompts", type=int, default=20, help="prompts per set (after a warm-up)")
    ev.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    ev.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ev.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    ev.add_argument("--repeats", type=int, default=1, help="reruns, for the speedup's spread")
    ev.add_argument(
        "--tree",
        action="store_true",
        help="EAGLE: EAGLE-2 dynamic trees; Medusa: its calibrated (else default) static tree",
    )
    _add_tree_options(ev)
    ev.add_argument(
        "--num-speculative-tokens", type=int, default=NUM_SPECULATIVE_TOKENS, help="chain length"
    )
    ev.add_argument("--raw", action="store_true", help="prompts as plain text, no chat template")
    ev.add_argument(
        "--teacher-forced",
        action="store_true",
        help="EAGLE: also estimate the chain's acceptance per draft step on the target's own "
        "continuations (every position, no speculative decoding)",
    )
    ev.add_argument(
        "--position-edges",
        type=int,
        nargs="+",
        default=[],
        help="with --teacher-forced: also split the first step by the sequence position its "
        "draft lands at, e.g. 128 256 384",
    )
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    ev.add_argument(
        "--static-cache",
        action="store_true",
        help="preallocated KV caches for the target and the drafter, target-only and "
        "speculative alike; on CUDA their decode forwards replay as CUDA graphs",
    )
    _add_certificate_options(ev, "--certificate-samples", "--certificate-prompts")
    _add_acceptance(ev)
    ev.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    ev.add_argument("--output-dir", help="where the report goes (default runs/eval-NAME)")
    ev.set_defaults(func=_eval)

    cert = commands.add_parser(
        "certify",
        help="add the losslessness certificate to a drafter's eval report",
        description="Samples the first tokens of a few of the report's prompts at T = 1 with "
        "the drafter as the report served it and tests their distribution against the "
        "target's exact one (docs/guarantees.md); writes it into the report. Exit 1 when it "
        "fails.",
    )
    cert.add_argument("drafter", help="the drafter folder or zoo name the report measured")
    cert.add_argument("--report", type=Path, required=True, help="its report.json (or folder)")
    cert.add_argument("--target", help="target folder or hub name (default: the drafter's own)")
    _add_certificate_options(cert, "--samples", "--prompts")
    cert.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    cert.set_defaults(func=_certify)

    pub = commands.add_parser(
        "publish",
        help="add a measured drafter to the zoo with its model card",
        description="Refused without an eval report of this very checkpoint (hash-checked). "
        "--push-to-hub uploads the published folder to a hub model repo; it needs network "
        "access and a hub token, so it cannot run on an offline machine.",
    )
    pub.add_argument("drafter", type=Path, help="the drafter folder")
    pub.add_argument("--report", type=Path, help="its report.json from `draftzoo eval`")
    pub.add_argument("--zoo", help="zoo folder (default $DRAFTZOO_ZOO or ~/.cache/draftzoo/zoo)")
    pub.add_argument("--name", help="zoo name (default: the recipe's name)")
    pub.add_argument("--overwrite", action="store_true", help="replace an entry of that name")
    pub.add_argument("--push-to-hub", metavar="ORG/NAME", help="also upload to this hub repo")
    pub.add_argument("--private", action="store_true", help="with --push-to-hub: private repo")
    pub.set_defaults(func=_publish)

    zoo = commands.add_parser("zoo", help="the zoo index")
    zoo_commands = zoo.add_subparsers(dest="zoo_command", required=True)
    listing = zoo_commands.add_parser("list", help="list published drafters and their numbers")
    listing.add_argument("--zoo", help="one zoo folder (default: yours, then the shipped one)")
    listing.set_defaults(func=_zoo_list)

    board = commands.add_parser(
        "leaderboard",
        help="rank every drafter of a target from its own report (markdown and a PNG)",
        description="One row per drafter: parameters, training tokens and time, tau and "
        "speedup at T = 0 and T = 1, efficiency, draft/verify ms, memory, certificate. Rows "
        "measured on other hardware or prompts go into separate tables, never one ranking.",
    )
    board.add_argument(
        "--zoo", action="append", help="a zoo folder (repeatable; default: yours and the shipped)"
    )
    board.add_argument(
        "--report", action="append", type=Path, default=[], help="an eval report.json to rank"
    )
    board.add_argument(
        "--references", type=Path, help="reference rows (bench/families.py's references.json)"
    )
    board.add_argument("--target", help="only drafters measured on this target")
    board.add_argument("--output-dir", help="write LEADERBOARD.md and leaderboard.png here")
    board.add_argument(
        "--readme", type=Path, help="rewrite the generated families table in this README"
    )
    board.set_defaults(func=_leaderboard)

    exp = commands.add_parser(
        "export",
        help="write a drafter in the layout vLLM, SGLang or speculators loads",
        description="eagle3: vllm | sglang | speculators; eagle1: vllm; medusa1, medusa2: "
        "vllm | medusa (the Medusa reference layout; a Medusa-2 export adds the adapted target "
        "in target/); mtp: vllm (DeepSeek-style targets: the target's checkpoint plus the "
        "modules, for vLLM's deepseek_mtp); draft_lm: hf.",
    )
    exp.add_argument("drafter", help="a drafter folder or a zoo name")
    exp.add_argument("--format", required=True, choices=["vllm", "sglang", "speculators", "hf"])
    exp.add_argument("--output-dir", required=True)
    exp.add_argument(
        "--target",
        help="the target's folder or hub name: checked against, and the source of the "
        "embedding (default: the recipe's)",
    )
    exp.add_argument(
        "--verifier",
        help="the target as the export records it (speculators' verifier, Medusa's base "
        "model; default: a local target's absolute path, else its hub name)",
    )
    exp.add_argument(
        "--embed-tokens",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="eagle3: write the target's input embedding (default: speculators yes, "
        "sglang/vllm no; SpecForge's strict load wants it)",
    )
    exp.add_argument(
        "--no-target-check", action="store_true", help="skip loading the target's config"
    )
    exp.add_argument(
        "--num-speculative-tokens", type=int, default=3, help="speculators: proposal length"
    )
    exp.set_defaults(func=_export)

    demo = commands.add_parser(
        "demo",
        help="train an EAGLE-3 drafter for the testbed, measure, publish, load it back, generate",
        description="The whole loop on the committed testbed-small target, a few minutes of "
        "training on two CPU cores; prints tau and speedup.",
    )
    demo.add_argument("--output-dir", default="runs/demo")
    demo.add_argument("--steps", type=int, default=600, help="training steps")
    demo.add_argument("--prompts", type=int, default=10, help="HumanEval prompts to measure on")
    demo.set_defaults(func=_demo)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `draftzoo` command."""
    args = build_parser().parse_args(argv)
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
