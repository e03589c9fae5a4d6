"""Capture forwards, packed rows under their block mask against each sample on its own
(data/sample_forward.py), side by side in one process on the recipe's own rows.

    python bench/capture_by_sample.py recipes/eagle3/smollm2-135m-instruct.yaml \
        --set data.source=sharegpt --set data.max_length=1024 --rows 24 --threads 2

Prints tokens per second of each (target forwards only, the capture's batches of 8 rows),
their ratio and the largest difference between the two sets of states.
"""

from __future__ import annotations

import argparse
import time

import torch

from draftzoo.data.batching import collate
from draftzoo.data.sample_forward import states_by_sample
from draftzoo.train.distributed import partial_state
from draftzoo.train.registry import load_recipe
from draftzoo.train.setup import cache_dir_of, load_target, prepare_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--rows", type=int, default=24, help="dataset rows timed (from row 0)")
    parser.add_argument("--batch", type=int, default=8, help="rows per forward")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    recipe = load_recipe(args.recipe, args.set)
    state = partial_state()
    target = load_target(recipe.target, state.device)
    dataset, _, _ = prepare_dataset(recipe.data, target.tokenizer, cache_dir_of(recipe), state)
    layers = recipe.capture_layers(target.num_layers)
    pad = target.tokenizer.pad_token_id or 0
    batches = [
        collate([dataset[i] for i in range(lo, min(lo + args.batch, args.rows))], pad)
        for lo in range(0, args.rows, args.batch)
    ]
    tokens = sum(sum(map(sum, b.lengths)) for b in batches)
    samples = sum(len(lengths) for b in batches for lengths in b.lengths)
    seconds = {"packed, masked": 0.0, "by sample": 0.0}
    largest = 0.0
    with torch.no_grad():
        states_by_sample(target, batches[0], layers)  # warm both paths once
        target(**batches[0].model_inputs(), hidden_indices=layers, compute_logits=False)
        for batch in batches:  # alternate, so drift in the machine's speed hits both
            started = time.perf_counter()
            masked = target(**batch.model_inputs(), hidden_indices=layers, compute_logits=False)
            seconds["packed, masked"] += time.perf_counter() - started
            started = time.perf_counter()
            alone = states_by_sample(target, batch, layers)
            seconds["by sample"] += time.perf_counter() - started
            for layer in layers:
                got, want = alone[layer], masked.hidden_states[layer]
                for row, lengths in enumerate(batch.lengths):
                    n = sum(lengths)
                    scale = want[row, :n].abs().max().item()
                    diff = (got[row, :n] - want[row, :n]).abs().max().item()
                    largest = max(largest, diff / scale)
    print(f"{len(batches)} batches of {args.batch} rows: {tokens} tokens, {samples} samples")
    for name, spent in seconds.items():
        print(f"{name:>15}: {spent:7.2f} s  {tokens / spent:7.0f} tokens/s")
    print(f"by sample / packed: {seconds['packed, masked'] / seconds['by sample']:.2f}x faster")
    print(f"largest difference of a state, relative to its row's largest: {largest:.2e}")


if __name__ == "__main__":
    main()
