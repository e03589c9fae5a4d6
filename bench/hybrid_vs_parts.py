"""The hybrid against its parts, per prompt category: target-only, prompt lookup, the drafter's
chain and the drafter served as a hybrid, decoded in one process, interleaved prompt by prompt.

    python bench/hybrid_vs_parts.py --target smollm2-135m-instruct \
        --drafter recipes/zoo/eagle3-smollm2-135m-instruct \
        --prompt-set mt-bench --prompt-set humaneval --prompts 16 --repeats 2 --threads 2

`--rule NAME:KEY=VALUE[,KEY=VALUE]` (repeatable) adds a row "hybrid NAME": the same drafter
served as a hybrid whose rule differs from the default in those `HybridSettings` fields (e.g.
`scores:pace=false`, the rule without a clock), in the same sitting.

Each repeat decodes every prompt once with every method (the hybrid keeps what it measured
across prompts and repeats, as a server would, but its global suffix cache starts empty in each
repeat: no repeat copies an earlier one's answers); the first prompt is a warm-up. Printed per
temperature and category: tau and speedup over target-only (tokens per second summed over the
category's prompts), the speedup's range over repeats, and at T = 0 the prompts whose output
differs from target-only (the contract is 0); then the hybrid's rounds by the rule's choice.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import torch
from bench_target import load_target

from draftzoo.eval.runner import EvalConfig, load_prompts
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.load import load_drafter
from draftzoo.inference.proposal_settings import ProposalSettings
from draftzoo.inference.proposers.hybrid import HybridSettings
from draftzoo.inference.proposers.prompt_lookup import prompt_lookup_runtime
from draftzoo.inference.sampling import SamplingParams


def rule_of(text: str) -> tuple[str, HybridSettings]:
    """`NAME:KEY=VALUE[,KEY=VALUE]` -> (row name, the default rule with those fields)."""
    name, _, pairs = text.partition(":")
    fields = {}
    for pair in filter(None, pairs.split(",")):
        key, _, value = pair.partition("=")
        fields[key] = {"true": True, "false": False}.get(value.lower())
        if fields[key] is None:
            fields[key] = int(value) if value.isdigit() else float(value)
    return f"hybrid {name}", HybridSettings(**fields)


def build_methods(args, target, tokenizer) -> tuple[dict[str, SpeculativeGenerator], list]:
    """target-only, prompt lookup, the drafter's chain and its hybrids (gamma tokens each); the
    hybrids' runtimes (each global suffix cache is emptied before each repeat)."""
    folder = Path(args.drafter)
    chain = ProposalSettings(num_speculative_tokens=args.gamma)
    rules = [("hybrid", HybridSettings()), *(rule_of(text) for text in args.rule)]
    hybrids = [
        (name, load_drafter(folder, target, tokenizer, replace(chain, hybrid=rule)))
        for name, rule in rules
    ]
    lookup = prompt_lookup_runtime(None, chain)
    chain = load_drafter(folder, target, tokenizer, chain)
    methods = {"target-only": SpeculativeGenerator(target, tokenizer)}
    for name, runtime in (("prompt lookup", lookup), ("chain", chain), *hybrids):
        methods[name] = SpeculativeGenerator(target, tokenizer, runtime.make_proposer(), args.gamma)
    return methods, hybrids


def main() -> None:
    args = _parse_args()
    tokenizer, target = load_target(args.target, threads=args.threads)
    methods, hybrids = build_methods(args, target, tokenizer)
    config = EvalConfig(tuple(args.prompt_set), max_prompts=args.prompts)
    prompts = load_prompts(config)
    print(
        f"{len(prompts) - 1} prompts of {' + '.join(args.prompt_set)} (+1 warm-up), "
        f"{args.max_new_tokens} new tokens, batch 1, gamma {args.gamma}, {args.repeats} "
        f"repeat(s), {torch.get_num_threads()} threads; drafter {args.drafter}"
    )
    for temperature in args.temperatures:
        # (category, method, repeat) -> [tokens, seconds, rounds]
        totals: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        mismatches: Counter[str] = Counter()
        before = {name: Counter(methods[name].proposer.choices) for name, _ in hybrids}
        for repeat in range(args.repeats):
            for _, hybrid in hybrids:
                hybrid.begin_pass()  # no repeat drafts from an earlier one's answers
            for index, prompt in enumerate(prompts):
                text = prompt.render(tokenizer, chat=True)
                params = SamplingParams(
                    temperature=temperature, max_new_tokens=args.max_new_tokens, seed=index
                )
                reference = None
                for name, generator in methods.items():
                    began = time.perf_counter()
                    out = generator.generate(text, params)
                    seconds = time.perf_counter() - began
                    if reference is None:
                        reference = out.token_ids
                    elif temperature == 0 and out.token_ids != reference and repeat == 0:
                        mismatches[name] += 1
                    if index == 0:
                        continue  # warm-up
                    for category in (prompt.category, "all"):
                        row = totals[(category, name, repeat)]
                        row[0] += len(out.token_ids)
                        row[1] += seconds
                        row[2] += out.metrics.num_target_forwards
        _print(temperature, totals, methods, args.repeats, mismatches)
        for name, _ in hybrids:
            rounds = Counter(methods[name].proposer.choices) - before[name]
            print(f"{name} rounds: " + ", ".join(f"{k} {rounds[k]}" for k in sorted(rounds)))


def _print(temperature, totals, methods, repeats, mismatches) -> None:
    """One line per category and method: tau, speedup (summed over repeats) and its range."""
    print(f"\nT = {temperature:g}")
    categories = sorted({key[0] for key in totals}, key=lambda c: (c == "all", c))
    print(f"{'category':16} {'method':20} {'tau':>5} {'speedup':>8} {'range':>13}")
    for category in categories:
        for name in methods:
            if name == "target-only":
                continue
            per_repeat, tokens, forwards, seconds = [], 0.0, 0.0, 0.0
            base_tokens, base_seconds = 0.0, 0.0
            for repeat in range(repeats):
                mine = totals[(category, name, repeat)]
                theirs = totals[(category, "target-only", repeat)]
                per_repeat.append((mine[0] / mine[1]) / (theirs[0] / theirs[1]))
                tokens, forwards, seconds = tokens + mine[0], forwards + mine[2], seconds + mine[1]
                base_tokens, base_seconds = base_tokens + theirs[0], base_seconds + theirs[1]
            speedup = (tokens / seconds) / (base_tokens / base_seconds)
            spread = f"{min(per_repeat):.2f}-{max(per_repeat):.2f}"
            print(f"{category:16} {name:20} {tokens / forwards:5.2f} {speedup:7.2f}x {spread:>13}")
    if temperature == 0:
        shown = ", ".join(f"{name} {mismatches[name]}" for name in methods if name != "target-only")
        print(f"prompts whose greedy output differs from target-only: {shown}")


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True, help="a drafter folder")
    parser.add_argument("--prompt-set", action="append", required=True)
    parser.add_argument("--prompts", type=int, default=16, help="per prompt set")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--rule", action="append", default=[], help="NAME:KEY=VALUE[,...]")
    return parser.parse_args()


if __name__ == "__main__":
    main()
