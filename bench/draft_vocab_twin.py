"""An EAGLE-3 drafter's twin with a larger draft vocabulary: what a larger head costs a round.

    python bench/draft_vocab_twin.py recipes/zoo/eagle3-smollm2-135m-instruct \
        runs/eagle3-smollm2-vocab16k-twin --size 16384
    python bench/drafter_bench.py --target smollm2-135m-instruct --chains-only \
        --eagle3 recipes/zoo/eagle3-smollm2-135m-instruct --eagle3 runs/eagle3-smollm2-vocab16k-twin

The twin keeps every weight and draft token of the drafter; the added tokens (the lowest target
ids not yet drafted: a BPE tokenizer's earliest merges) get zero rows, so their logits are 0:
wherever the drafter's best logit is positive the twin drafts the same tokens at T = 0, and
drafter_bench's draft milliseconds per round then differ by the head's size alone (at T = 1 the
added tokens take probability mass: compare only the milliseconds there). The added rows are
not trained: the twin's tau says nothing about a trained drafter with that vocabulary. (Rows
copied from the target's head, as training starts one, outvote the trained rows and draft almost
nothing acceptable: tau 1.01.)
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from bench_target import load_target

from draftzoo.architectures.drafter_io import read_drafter_record
from draftzoo.architectures.eagle import EagleDrafter, load_eagle
from draftzoo.architectures.target import TargetAdapter

WRITTEN = ("config.json", "model.safetensors")


def widened(drafter: EagleDrafter, target: TargetAdapter, size: int) -> EagleDrafter:
    """`drafter` with `size` draft tokens: its own rows kept, zero rows for the added ones."""
    vocab = target.lm_head.weight.shape[0]
    if not drafter.draft_vocab_size < size <= vocab:
        raise SystemExit(f"--size must be above {drafter.draft_vocab_size} and at most {vocab}")
    kept = drafter.t2d.bool()
    added = torch.nonzero(~kept, as_tuple=True)[0][: size - drafter.draft_vocab_size]
    combined = torch.cat([torch.nonzero(kept, as_tuple=True)[0], added])
    order = torch.argsort(combined)
    union = combined[order]
    blank = drafter.lm_head.weight.new_zeros(len(added), drafter.lm_head.weight.shape[1])
    rows = torch.cat([drafter.lm_head.weight, blank])
    twin = EagleDrafter({**drafter.fields, "draft_vocab_size": size}, drafter.layers)
    replaced = ("lm_head.weight", "d2t", "t2d")
    state = {k: v for k, v in drafter.drafter_state_dict().items() if k not in replaced}
    loaded = twin.load_state_dict({**state, "lm_head.weight": rows[order]}, strict=False)
    left = [k for k in loaded.missing_keys if k.split(".")[0] not in ("rotary", "d2t", "t2d")]
    if left or loaded.unexpected_keys:
        raise SystemExit(f"twin weights do not match: {left} {loaded.unexpected_keys}")
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[union] = True
    twin.set_vocab_map(union - torch.arange(size), t2d)
    return twin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafter", type=Path, help="an EAGLE-3 drafter folder")
    parser.add_argument("output", type=Path, help="a new folder for the twin")
    parser.add_argument("--size", type=int, default=16384, help="the twin's draft vocabulary")
    args = parser.parse_args()
    if args.output.exists():
        raise SystemExit(f"{args.output} exists; name a new folder")
    record = read_drafter_record(args.drafter)
    _, model = load_target(record["recipe"]["target"]["path"])
    target = TargetAdapter(model)
    drafter = load_eagle(args.drafter, target, record=record)
    if drafter.kind != "eagle3":
        raise SystemExit(f"{args.drafter} is not an EAGLE-3 drafter")
    twin = widened(drafter, target, args.size)
    partial = args.output.with_name(args.output.name + ".partial")
    shutil.copytree(args.drafter, partial, ignore=shutil.ignore_patterns(*WRITTEN))
    twin.to(torch.bfloat16).save_pretrained(partial)
    partial.rename(args.output)
    print(f"{args.output}: draft vocabulary {drafter.draft_vocab_size} -> {args.size}")


if __name__ == "__main__":
    main()
