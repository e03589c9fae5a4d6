"""EAGLE drafters side by side by teacher-forced acceptance, without speculative decoding.

    python bench/teacher_forced_bench.py --eagle1 recipes/zoo/eagle1-testbed-small \
        --eagle3 recipes/zoo/eagle3-testbed-small --prompt-set humaneval --prompts 20 \
        --temperatures 0 1

The target decodes each prompt alone (chat-rendered; prompt i samples with seed i at T > 0);
every drafter is then scored on every position of those sequences
(`draftzoo.eval.teacher_forced`). Printed per drafter and temperature: the estimated tau of a
--steps chain, the acceptance estimate of each draft step, the target's mean probability on
tokens the drafter cannot propose (an EAGLE-3 drafter's pruned vocabulary), and the step
acceptances counting only tokens that every compared drafter can propose, which separates what
a pruned vocabulary costs from how well a drafter predicts inside it.

`--position-edges 128 256 384` adds, per drafter, the first step's acceptance split by the
sequence position its draft lands at ([0, 128), [128, 256), ...): with `--max-new-tokens`
long enough, it shows how drafters trained on rows of some length hold up past it.
Every run also splits the first step by whether the token drafted repeats an earlier bigram
of its sequence (a copy from the context) or is fresh (`draftzoo.data.repeats`).

`--ablate-layers` asks which target layers an EAGLE-3 drafter's fusion relies on: each tapped
layer's share of the fusion weights (Frobenius norm of its block of `fc`, over the blocks'
total), and the drafter scored again with that layer's states replaced by their mean over each
sequence's positions (mean ablation: what the layer tells beyond its average is taken away).
`--prompt-set` repeats (e.g. `humaneval` and a held-out question file); `--prompts` is per set.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from bench_target import load_target

from draftzoo.architectures.eagle import load_eagle
from draftzoo.architectures.target import TargetAdapter
from draftzoo.data.prompts import load_prompt_set
from draftzoo.eval.teacher_forced import proposable, target_sequences, teacher_forced_scores
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.testbed import committed_testbed_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(committed_testbed_dir()))
    parser.add_argument("--eagle1", action="append", default=[], help="EAGLE-1 folder (repeatable)")
    parser.add_argument("--eagle3", action="append", default=[], help="EAGLE-3 folder (repeatable)")
    parser.add_argument(
        "--prompt-set",
        action="append",
        default=[],
        help="humaneval (default), stdlib-heldout or a question file (repeatable)",
    )
    parser.add_argument("--prompts", type=int, default=20, help="prompts from each set")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--steps", type=int, default=4, help="draft steps (chain length)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument(
        "--position-edges",
        type=int,
        nargs="*",
        default=[],
        help="split the first step's acceptance by draft position at these edges",
    )
    parser.add_argument(
        "--ablate-layers",
        action="store_true",
        help="EAGLE-3: each tapped layer's fusion-weight share and its mean-ablated acceptance",
    )
    args = parser.parse_args()
    tokenizer, target = load_target(args.target, "cpu", args.threads)
    adapter = TargetAdapter(target, tokenizer)
    drafters = {}
    for kind, folders in (("EAGLE-1", args.eagle1), ("EAGLE-3", args.eagle3)):
        for folder in folders:
            label = kind if len(folders) == 1 else f"{kind} {Path(folder).name}"
            drafters[label] = load_eagle(Path(folder), adapter)
    if not drafters:
        parser.error("give at least one --eagle1 or --eagle3 drafter")
    common = torch.stack([proposable(d) for d in drafters.values()]).all(0)
    prompt_sets = args.prompt_set or ["humaneval"]
    prompts = [
        p.render(tokenizer, chat=True)
        for name in prompt_sets
        for p in load_prompt_set(name)[: args.prompts]
    ]
    if args.ablate_layers:
        drafters.update(ablated_variants(drafters))
    print(
        f"{len(prompts)} prompts ({', '.join(prompt_sets)}), {args.max_new_tokens} new tokens "
        f"decoded by the target, {args.steps} draft steps; common vocabulary "
        f"{int(common.sum())} of {len(common)} tokens; {torch.get_num_threads()} threads"
    )
    width = max(16, *(len(name) for name in drafters))
    for temperature in args.temperatures:
        params = SamplingParams(temperature=temperature, max_new_tokens=args.max_new_tokens)
        sequences = target_sequences(target, tokenizer, prompts, params)
        print(f"\nT = {temperature:g}")
        print(
            f"{'drafter':{width}} {'tau':>5} {'positions':>9} {'outside':>8}  "
            "acceptance per step | inside the common vocabulary"
        )
        by_position, by_repeat = {}, {}
        for name, drafter in drafters.items():
            scores = teacher_forced_scores(
                drafter, adapter, sequences, params, args.steps, common, args.position_edges
            )
            steps = " ".join(f"{a:.3f}" for a in scores.acceptance)
            steps_inside = " ".join(f"{a:.3f}" for a in scores.within)
            print(
                f"{name:{width}} {scores.tau:5.2f} {scores.positions:9d} "
                f"{scores.outside_mass:8.3f}  {steps} | {steps_inside}"
            )
            by_position[name] = scores.by_position
            by_repeat[name] = scores.repeated, scores.fresh
        for name, (repeated, fresh) in by_repeat.items():
            print(
                f"{name:{width}} first step on repeated bigrams {repeated.acceptance:.3f} "
                f"({repeated.positions}), on fresh tokens {fresh.acceptance:.3f} "
                f"({fresh.positions})"
            )
        for name, position_buckets in by_position.items() if args.position_edges else ():
            buckets = "  ".join(
                f"[{b.start},{'' if b.end is None else b.end}) {b.acceptance:.3f} ({b.positions})"
                for b in position_buckets
            )
            print(f"{name:{width}} first step by draft position: {buckets}")


def fusion_shares(drafter) -> list[float]:
    """Each tapped layer's share of an EAGLE-3 fusion's weights: the Frobenius norm of its
    column block of `fc` over the sum of the blocks' norms."""
    blocks = drafter.fc.weight.detach().float().chunk(len(drafter.layers), dim=1)
    norms = torch.stack([block.norm() for block in blocks])
    return (norms / norms.sum()).tolist()


class MeanAblated:
    """An EAGLE-3 drafter whose fusion sees one tapped layer's states replaced by their mean
    over the sequence's positions; every other attribute is the drafter's own."""

    def __init__(self, drafter, index: int) -> None:
        self._drafter, self._index = drafter, index

    def __getattr__(self, name: str):
        return getattr(self._drafter, name)

    def fuse(self, states: torch.Tensor) -> torch.Tensor:
        pieces = list(states.chunk(len(self._drafter.layers), dim=-1))
        piece = pieces[self._index]
        pieces[self._index] = piece.mean(dim=1, keepdim=True).expand_as(piece)
        return self._drafter.fuse(torch.cat(pieces, dim=-1))


def ablated_variants(drafters: dict) -> dict:
    """For every EAGLE-3 drafter, one mean-ablated variant per tapped layer (its fusion-weight
    share printed here)."""
    variants = {}
    for name, drafter in drafters.items():
        if drafter.kind != "eagle3":
            continue
        shares = fusion_shares(drafter)
        pairs = zip(drafter.layers, shares, strict=True)
        listed = ", ".join(f"layer {layer} {share:.2f}" for layer, share in pairs)
        print(f"{name}: fusion-weight share {listed}")
        for index, layer in enumerate(drafter.layers):
            variants[f"{name} without layer {layer}"] = MeanAblated(drafter, index)
    return variants


if __name__ == "__main__":
    main()
