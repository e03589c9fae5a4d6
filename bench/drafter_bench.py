"""Drafter families side by side: tau and end-to-end speedup over target-only, batch 1.

    python bench/drafter_bench.py --draft-lm recipes/zoo/draft-lm-testbed-small \
        --eagle1 recipes/zoo/eagle1-testbed-small --eagle3 recipes/zoo/eagle3-testbed-small \
        --prompt-set humaneval --prompts 20 --temperatures 0 1

    python bench/drafter_bench.py --target smollm2-135m-instruct \
        --eagle3 runs/eagle3-smollm2-135m-instruct --hybrid runs/eagle3-smollm2-135m-instruct \
        --lookup --suffix --prompt-set humaneval --prompt-set runs/smollm2-data/eval-turns.jsonl \
        --heldout-from runs/smollm2-data/train.jsonl --prompts 8 --threads 2

`--lookup` and `--suffix` add prompt lookup and suffix decoding (chains of --gamma);
`--hybrid` serves a drafter's chain beside prompt lookup and suffix decoding under the default
hybrid rule (weighing paces; bench/hybrid_vs_parts.py compares it with its parts per
category). Several `--prompt-set`s are taken in turn, `--prompts` of each (the first set's
first prompt is the warm-up), past prompts overlapping `--heldout-from`. `--eagle1` / `--eagle3` /
`--mtp` / `--medusa` / `--hybrid` may be given several times (rows then carry the folder's
name), and `--drafter` (any family's folder, its chain; rows named by family and folder), so
drafters trained differently are compared in one process against one target-only baseline. A
Medusa drafter gives a chain and its calibrated tree; a Medusa-2 drafter serves a copy of the
target with its LoRA merged, whose own target-only row is its greedy reference (speedups stay
against the original target-only).

Every method decodes the same prompts (chat-rendered) with the same target in one process,
interleaved prompt by prompt, after one warm-up prompt: target-only, the draft LM (chain),
EAGLE-1 (chain), EAGLE-3 (chain), EAGLE-3 with EAGLE-2 dynamic trees and MTP modules (chain).
Chains draft a fixed --gamma tokens; trees use --tree-top-k / --tree-depth / --tree-tokens (at
T > 0 sampled trees, --tree-sampled-children wide). At T > 0 every method samples with the
same per-prompt seed (outputs differ by design; sampling is lossless, which the test suite
checks by distribution).
Printed per method: tau, tokens/s, speedup over target-only, milliseconds of drafting and of
verification per round and their ratio (the cost that separates the speedup from tau), at
T = 0 the prompts whose output differs from target-only (the contract is 0), and the share of
drafting rounds that accepted the k-th draft token.

`--device cuda --static` runs every method (target-only included) on preallocated caches with
CUDA graphs for the target's forwards and every drafter's (EAGLE chains and greedy EAGLE-2
trees, Medusa heads, MTP modules; sampled EAGLE trees draft eagerly on static buffers).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import torch
from bench_target import load_target
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftzoo.architectures.drafter_io import read_drafter_record
from draftzoo.architectures.families import family_spec
from draftzoo.eval.runner import EvalConfig, load_prompts
from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.load import load_drafter
from draftzoo.inference.proposal_settings import ProposalSettings
from draftzoo.inference.proposers.draft_lm import DraftModelProposer
from draftzoo.inference.proposers.eagle import EagleProposer, TreeSettings
from draftzoo.inference.proposers.hybrid import HybridSettings
from draftzoo.inference.proposers.mtp import MtpProposer
from draftzoo.inference.proposers.prompt_lookup import prompt_lookup_runtime
from draftzoo.inference.proposers.suffix_decoding import suffix_runtime
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.testbed import committed_testbed_dir


def build_methods(
    args, target, tokenizer, cpu_kernels: bool | None = None
) -> dict[str, SpeculativeGenerator]:
    """One generator per method (None proposer = target-only); `cpu_kernels` as
    `CacheSettings` takes it (None: where they apply)."""
    static = {"cache": CacheSettings(static=args.static, cpu_kernels=cpu_kernels)}
    methods = {"target-only": SpeculativeGenerator(target, tokenizer, **static)}
    if args.draft_lm:
        draft = AutoModelForCausalLM.from_pretrained(args.draft_lm, dtype=torch.float32)
        draft_tokenizer = AutoTokenizer.from_pretrained(args.draft_lm)
        proposer = DraftModelProposer(draft.to(args.device), draft_tokenizer, tokenizer, **static)
        methods["draft-LM chain"] = SpeculativeGenerator(
            target, tokenizer, proposer, args.gamma, **static
        )
    tree = TreeSettings(
        args.tree_top_k, args.tree_depth, args.tree_tokens, args.tree_sampled_children
    )
    for kind, folders in (("EAGLE-1", args.eagle1), ("EAGLE-3", args.eagle3)):
        for folder in folders:
            # several drafters of one family are told apart by their folder's name
            label = kind if len(folders) == 1 else f"{kind} {Path(folder).name}"
            chain = EagleProposer.from_pretrained(folder, target, tokenizer)
            chain = EagleProposer(chain.drafter, None, **static)
            methods[f"{label} chain"] = SpeculativeGenerator(
                target, tokenizer, chain, args.gamma, **static
            )
            if (kind == "EAGLE-3" and not args.chains_only) or args.eagle1_tree:
                trees = EagleProposer(chain.drafter, tree, **static)
                methods[f"{label} tree"] = SpeculativeGenerator(
                    target, tokenizer, trees, args.tree_depth, **static
                )
    for folder in args.hybrid:
        label = "hybrid" if len(args.hybrid) == 1 else f"hybrid {Path(folder).name}"
        hybrid = ProposalSettings(num_speculative_tokens=args.gamma, hybrid=HybridSettings())
        runtime = load_drafter(Path(folder), target, tokenizer, hybrid)
        methods[label] = SpeculativeGenerator(
            target, tokenizer, runtime.make_proposer(), args.gamma, **static
        )
    if args.lookup:
        proposer = prompt_lookup_runtime(None, ProposalSettings(args.gamma)).make_proposer()
        methods["prompt lookup"] = SpeculativeGenerator(
            target, tokenizer, proposer, args.gamma, **static
        )
    if args.suffix:
        proposer = suffix_runtime(None, ProposalSettings(args.gamma)).make_proposer()
        methods["suffix chain"] = SpeculativeGenerator(
            target, tokenizer, proposer, args.gamma, **static
        )
    for folder in args.medusa:
        methods.update(_medusa_methods(args, folder, target, tokenizer, len(args.medusa) > 1))
    for folder in args.drafter:
        record = read_drafter_record(Path(folder))
        label = f"{family_spec(record['family']).display_name} {Path(folder).name}"
        settings = ProposalSettings(num_speculative_tokens=args.gamma)
        runtime = load_drafter(Path(folder), target, tokenizer, settings, static["cache"])
        methods[f"{label} chain"] = SpeculativeGenerator(
            target, tokenizer, runtime.make_proposer(), args.gamma, **static
        )
    for folder in args.mtp:
        label = "MTP" if len(args.mtp) == 1 else f"MTP {Path(folder).name}"
        proposer = MtpProposer.from_pretrained(folder, target, tokenizer)
        proposer = MtpProposer(proposer.drafter, **static)
        methods[f"{label} chain"] = SpeculativeGenerator(
            target, tokenizer, proposer, args.gamma, **static
        )
    return methods


def _medusa_methods(args, folder, target, tokenizer, named: bool) -> dict:
    """A Medusa drafter's chain and calibrated tree (Medusa-2: on an adapted copy of the
    target, with that copy's own target-only row first)."""
    import copy

    from draftzoo.inference.proposers.medusa import MedusaProposer, MedusaTree, calibrated_tree

    record = read_drafter_record(Path(folder))
    family = "Medusa-1" if record["family"] == "medusa1" else "Medusa-2"
    label = family if not named else f"{family} {Path(folder).name}"
    served = target if family == "Medusa-1" else copy.deepcopy(target)
    static = {"cache": CacheSettings(static=args.static)}
    methods = {}
    if served is not target:
        methods[f"target-only ({label} adapted)"] = SpeculativeGenerator(
            served, tokenizer, **static
        )
    runtime = load_drafter(
        Path(folder),
        served,
        tokenizer,
        ProposalSettings(num_speculative_tokens=args.gamma),
        CacheSettings(static=args.static),
    )
    methods[f"{label} chain"] = SpeculativeGenerator(
        served, tokenizer, runtime.make_proposer(), args.gamma, **static
    )
    heads = runtime.module
    tree = calibrated_tree(record) or MedusaTree.default(heads.num_heads)
    layer = runtime.make_proposer().target_layers[0]
    trees = MedusaProposer(heads, layer, tree, CacheSettings(static=args.static))
    methods[f"{label} tree"] = SpeculativeGenerator(served, tokenizer, trees, tree.depth, **static)
    return methods


def _parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(committed_testbed_dir()))
    parser.add_argument("--draft-lm", help="a draft LM folder")
    parser.add_argument(
        "--eagle1", action="append", default=[], help="an EAGLE-1 drafter folder (repeatable)"
    )
    parser.add_argument(
        "--eagle3", action="append", default=[], help="an EAGLE-3 drafter folder (repeatable)"
    )
    parser.add_argument(
        "--mtp", action="append", default=[], help="an MTP drafter folder (repeatable)"
    )
    parser.add_argument(
        "--medusa", action="append", default=[], help="a Medusa-1/2 drafter folder (repeatable)"
    )
    parser.add_argument(
        "--drafter",
        action="append",
        default=[],
        help="any family's drafter folder, its chain through load_drafter (repeatable)",
    )
    parser.add_argument("--eagle1-tree", action="store_true", help="add EAGLE-1 with trees")
    parser.add_argument("--chains-only", action="store_true", help="no EAGLE-3 tree row")
    parser.add_argument(
        "--hybrid",
        action="append",
        default=[],
        help="a drafter folder served as a hybrid: its chain beside the model-free proposals",
    )
    parser.add_argument("--lookup", action="store_true", help="add prompt lookup (chain)")
    parser.add_argument("--suffix", action="store_true", help="add suffix decoding (chain)")
    parser.add_argument(
        "--prompt-set",
        action="append",
        help="a prompt set or question file (.jsonl); several are taken in turn "
        "(default: humaneval)",
    )
    parser.add_argument(
        "--heldout-from",
        action="append",
        default=[],
        help="training data whose overlapping prompts are dropped first",
    )
    parser.add_argument("--prompts", type=int, default=20, help="per prompt set")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--gamma", type=int, default=4, help="chain length")
    parser.add_argument("--tree-top-k", type=int, default=10)
    parser.add_argument("--tree-depth", type=int, default=6)
    parser.add_argument("--tree-tokens", type=int, default=60)
    parser.add_argument("--tree-sampled-children", type=int, default=3, help="T > 0 trees")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--static", action="store_true", help="preallocated caches (CUDA graphs on cuda)"
    )
    parser.add_argument(
        "--compare-kernels",
        action="store_true",
        help="also every method on the stock kernels, rows '(stock)' (inference/cpu_kernels.py)",
    )
    return parser.parse_args()


def main() -> None:
    args = _parse_args()
    tokenizer, target = load_target(args.target, args.device, args.threads)
    methods = build_methods(args, target, tokenizer)
    if args.compare_kernels:  # every method again on the stock kernels, target-only aside
        stock = build_methods(args, target, tokenizer, cpu_kernels=False)
        methods.update({f"{k} (stock)": v for k, v in stock.items() if k != "target-only"})
    sets = tuple(args.prompt_set or ["humaneval"])
    config = EvalConfig(sets, max_prompts=args.prompts, heldout_from=tuple(args.heldout_from))
    prompts = [p.render(tokenizer, chat=True) for p in load_prompts(config)]
    tree = (
        f"top_k {args.tree_top_k}, depth {args.tree_depth}, {args.tree_tokens} tokens, "
        f"{args.tree_sampled_children} sampled children at T > 0"
    )
    print(
        f"{len(prompts) - 1} prompts of {' + '.join(sets)}, {args.max_new_tokens} new tokens, "
        "batch 1, "
        f"chain gamma {args.gamma}, trees {tree}, {torch.get_num_threads()} threads, "
        f"{args.device}{', static caches' if args.static else ''}"
    )
    for temperature in args.temperatures:
        totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        accepted_at: dict[str, list[int]] = defaultdict(list)  # rounds accepting position k
        mismatches: dict[str, int] = defaultdict(int)
        for index, prompt in enumerate(prompts):
            params = SamplingParams(
                temperature=temperature, max_new_tokens=args.max_new_tokens, seed=index
            )
            references = {}  # each target-only row's output: the greedy reference
            for name, generator in methods.items():
                began = time.perf_counter()
                out = generator.generate(prompt, params)
                seconds = time.perf_counter() - began
                if name.startswith("target-only"):
                    references[name] = out.token_ids
                elif temperature == 0 and out.token_ids != references[_baseline(name)]:
                    mismatches[name] += 1
                if index == 0:
                    continue  # warm-up
                row, m = totals[name], out.metrics
                row["tokens"] += len(out.token_ids)
                row["seconds"] += seconds
                row["forwards"] += m.num_target_forwards
                row["draft"] += m.draft_seconds
                row["verify"] += m.verify_seconds
                row["drafts"] += m.num_drafts
                counts = accepted_at[name]
                counts.extend([0] * (len(m.num_accepted_tokens_per_pos) - len(counts)))
                for k, n in enumerate(m.num_accepted_tokens_per_pos):
                    counts[k] += n
        base = totals["target-only"]["tokens"] / totals["target-only"]["seconds"]
        print(f"\nT = {temperature:g}")
        width = max(16, *(len(name) for name in totals))
        header = f"{'method':{width}} {'tau':>5} {'tok/s':>7} {'speedup':>8} {'draft ms':>9}"
        print(header + f" {'verify ms':>10} {'draft/verify':>13} {'mismatch':>9}")
        for name, row in totals.items():
            rate = row["tokens"] / row["seconds"]
            rounds = max(row["forwards"], 1)
            draft_ms, verify_ms = 1e3 * row["draft"] / rounds, 1e3 * row["verify"] / rounds
            ratio = draft_ms / verify_ms if verify_ms else 0.0
            shown = str(mismatches[name]) if temperature == 0 else "-"
            print(
                f"{name:{width}} {row['tokens'] / rounds:5.2f} {rate:7.1f} {rate / base:7.2f}x "
                f"{draft_ms:9.2f} {verify_ms:10.2f} {ratio:13.2f} {shown:>9}"
            )
        print("acceptance per position (share of drafting rounds accepting draft token k):")
        for name, counts in accepted_at.items():
            drafts = max(totals[name]["drafts"], 1)
            if counts:
                print(f"  {name:{width}} " + " ".join(f"{n / drafts:.3f}" for n in counts))


def _baseline(name: str) -> str:
    """The target-only row a method's greedy output must equal (Medusa-2: its adapted
    target's)."""
    family = name.rsplit(" ", 1)[0]  # "Medusa-2 [folder]" of "Medusa-2 [folder] chain"
    adapted = f"target-only ({family} adapted)"
    return adapted if family.startswith("Medusa-2") else "target-only"


if __name__ == "__main__":
    main()
