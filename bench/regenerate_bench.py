"""Regeneration throughput: batches grouped by prompt length against batches in source order.

    python bench/regenerate_bench.py --rows 256 --batch-size 32 --sort-window 8

Regenerates the same `testbed-chat` rows with the committed testbed target twice in one
process, through `draftzoo.data.regenerate` (sampled at T = 1, the same seed), once with
`sort_window=1` (each batch in source order, padded to its longest prompt) and once grouped by
prompt length, after an untimed warm-up, and prints answer tokens per second for each and
their ratio. Answer tokens are counted by tokenizing the written answers, as training would see
them.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from draftzoo.data.regenerate import RegenerateConfig, regenerate
from draftzoo.data.testbed_chat import TESTBED_CHAT
from draftzoo.data.token_dataset import DataConfig
from draftzoo.train.recipe_config import TargetSpec
from draftzoo.train.setup import load_target
from draftzoo.train.testbed import committed_testbed_dir


def _answer_tokens(path: Path, tokenizer) -> int:
    count = 0
    for line in path.read_text().splitlines():
        for message in json.loads(line).get("messages") or []:
            if message["role"] == "assistant":
                ids = tokenizer(message["content"], add_special_tokens=False)["input_ids"]
                count += len(ids)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256, help="conversations regenerated per run")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sort-window", type=int, default=8, help="the grouped run's window")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(TargetSpec(path=str(committed_testbed_dir())), "cpu")
    data = DataConfig(source=TESTBED_CHAT)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        warm_up = RegenerateConfig(max_new_tokens=8, batch_size=args.batch_size, limit=4)
        regenerate(target, data, Path(tmp) / "warm-up.jsonl", warm_up)  # untimed
        for window in (1, args.sort_window):
            config = RegenerateConfig(
                temperature=1.0,
                max_new_tokens=args.max_new_tokens,
                batch_size=args.batch_size,
                limit=args.rows,
                sort_window=window,
            )
            out = Path(tmp) / f"window-{window}.jsonl"
            began = time.perf_counter()
            regenerate(target, data, out, config)
            seconds = time.perf_counter() - began
            tokens = _answer_tokens(out, target.tokenizer)
            results[window] = tokens / seconds
            print(
                f"sort_window {window}: {tokens} answer tokens in {seconds:.1f} s, "
                f"{tokens / seconds:.0f} tokens/s"
            )
    ratio = results[args.sort_window] / results[1]
    print(f"grouped by prompt length / source order: {ratio:.2f}x")


if __name__ == "__main__":
    main()
