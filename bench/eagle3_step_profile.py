"""Where an EAGLE-3 training step goes on SmolLM2's shapes, and what the fast paths save.

The setup of `teacher_reads_bench.py` (SmolLM2-135M-Instruct's hidden size and vocabulary, the
SmolLM2 EAGLE-3 recipe, random weights), at `--rows` packed rows of each `--lengths`, one loss
forward and backward under the recipes' precision. Two ways alternate in one process:
"autograd" (the training-time-test attention holding its [s, s] scores, the draft head's soft
cross-entropy through autograd) and "fused" (the CPU flash kernel for that attention,
`architectures/ttt_attention.py`, and `train/fused_head_loss.py`); their medians, ratio and
tokens per second are printed. `--profile` adds the torch profiler's table of the fused step.

    python bench/eagle3_step_profile.py                       # 4 rows of 512 and of 1024
    python bench/eagle3_step_profile.py --lengths 1024 --profile
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import nullcontext

import torch
from teacher_reads_bench import step_seconds
from torch.profiler import ProfilerActivity, profile


def _setup(rows: int, length: int):
    import teacher_reads_bench as bench

    from draftzoo.data.batching import collate

    loss, model, _, states = bench._setup("eagle3")
    vocab = 49_152
    cut = [length // 3, length // 4, length - length // 3 - length // 4]
    batch = collate(
        [
            {
                "input_ids": torch.randint(0, vocab, (length,)).tolist(),
                "loss_mask": [1] * length,
                "lengths": cut,
                "index": i,
            }
            for i in range(rows)
        ],
        0,
    )
    states = {k: torch.randn(rows, length, v.shape[-1]) for k, v in states.items()}
    return loss, model, batch, states


def _ways():
    """name -> a function that switches the step to that way."""
    import draftzoo.architectures.eagle as eagle
    import draftzoo.train.eagle_batch as eagle_batch

    fused_attention, whole_head = eagle.ttt_attention, eagle_batch._whole_head

    def autograd() -> None:
        eagle.ttt_attention, eagle_batch._whole_head = eagle.eager_ttt_attention, lambda m: None

    def fused() -> None:
        eagle.ttt_attention, eagle_batch._whole_head = fused_attention, whole_head

    return {"autograd": autograd, "fused": fused}


def main() -> None:
    from draftzoo.train.precision import native_bf16

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bf16 = native_bf16(torch.device("cpu"))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
    ways = _ways()
    print(f"{'tokens':>12} {'autograd s':>10} {'fused s':>8} {'ratio':>6} {'fused tokens/s':>14}")
    for length in args.lengths:
        setup = _setup(args.rows, length)
        times: dict[str, list[float]] = {way: [] for way in ways}
        for repeat in range(args.repeats + 1):  # the first of each is a warm-up
            for way, switch in ways.items():
                switch()
                seconds = step_seconds(*setup, autocast)
                if repeat:
                    times[way].append(seconds)
        slow, fast = (statistics.median(times[way]) for way in ways)
        tokens = args.rows * length
        print(
            f"{args.rows:>4} x {length:<5} {slow:10.2f} {fast:8.2f} {slow / fast:6.2f} "
            f"{tokens / fast:14.0f}",
            flush=True,
        )
    precision = "bfloat16 autocast" if bf16 else "float32"
    print(f"{args.threads} threads, {precision}, medians of {args.repeats} alternating steps")
    if args.profile:
        ways["fused"]()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step_seconds(*setup, autocast)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
