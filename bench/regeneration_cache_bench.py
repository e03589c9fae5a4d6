"""Regeneration's batched sampling on transformers' dynamic cache against its static cache.

`draftzoo regenerate` answers with transformers `generate` on its default (dynamic) cache. This
runs the same sampled batches both ways in one process (alternating, after an untimed warm-up
of each) with the real SmolLM2-135M-Instruct (`draftzoo target get smollm2-135m-instruct`
first): `--batch-size` prompts of `--prompt-tokens` random tokens, exactly `--new-tokens` new
ones each, T = 0.7, top-p 0.95 as `bench/smollm2_sharegpt.sh` regenerates, and prints tokens
per second (prompt prefill included) for each.

    python bench/regeneration_cache_bench.py --batch-size 32 --prompt-tokens 100 --new-tokens 64
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from draftzoo.train.recipe_config import TargetSpec
from draftzoo.train.setup import load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(TargetSpec(path=args.target, dtype=args.dtype), "cpu")
    torch.manual_seed(0)
    ids = torch.randint(100, target.model.config.vocab_size, (args.batch_size, args.prompt_tokens))
    caches = {"dynamic": {}, "static": {"cache_implementation": "static"}}
    seconds: dict[str, list[float]] = {name: [] for name in caches}
    for repeat in range(args.repeats + 1):  # the first of each is a warm-up
        for name, extra in caches.items():
            began = time.perf_counter()
            target.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=True,
                temperature=0.7,
                top_p=0.95,
                pad_token_id=target.tokenizer.pad_token_id,
                **extra,
            )
            if repeat:
                seconds[name].append(time.perf_counter() - began)
    tokens = args.batch_size * args.new_tokens
    for name, values in seconds.items():
        print(f"{name:8} {tokens / statistics.median(values):7.1f} new tokens/s")
    print(
        f"batch {args.batch_size}, {args.prompt_tokens}-token prompts, {args.new_tokens} new "
        f"tokens, {args.dtype}, {args.threads} threads, medians of {args.repeats}"
    )


if __name__ == "__main__":
    main()
