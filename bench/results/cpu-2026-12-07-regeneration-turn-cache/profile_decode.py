"""Where a sampled `generate` step of SmolLM2 goes on two threads: batches of 16 and 4 prompts of
500 random tokens, 48 new tokens at T = 0.7, top-p 0.95 (torch profiler, top operators).

    python bench/results/cpu-2026-12-07-regeneration-turn-cache/profile_decode.py
"""

from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

from draftzoo.train.recipe_config import TargetSpec
from draftzoo.train.setup import load_target

NEW_TOKENS = 48


def main() -> None:
    torch.set_num_threads(2)
    target = load_target(TargetSpec(path="smollm2-135m-instruct", dtype="float32"), "cpu")
    torch.manual_seed(0)
    for rows, prompt_tokens in ((16, 500), (4, 500)):
        ids = torch.randint(100, 49000, (rows, prompt_tokens))
        settings = dict(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=0.7,
            top_p=0.95,
            pad_token_id=target.tokenizer.pad_token_id,
        )
        target.model.generate(**settings, max_new_tokens=4, min_new_tokens=4)  # warm-up
        began = time.perf_counter()
        target.model.generate(**settings, max_new_tokens=1, min_new_tokens=1)
        prefill = time.perf_counter() - began
        began = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as profiled:
            target.model.generate(**settings, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
        step = (time.perf_counter() - began - prefill) / (NEW_TOKENS - 1)
        print(
            f"batch {rows}: prefill {prefill:.2f} s, {step * 1000:.1f} ms a step, "
            f"{step / rows * 1000:.1f} ms a row-step"
        )
        print(profiled.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
