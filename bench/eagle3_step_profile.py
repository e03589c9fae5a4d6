"""Where an EAGLE-3 training step goes on SmolLM2's shapes, and what the fast paths save.

The setup of `teacher_reads_bench.py` (SmolLM2-135M-Instruct's hidden size and vocabulary, the
SmolLM2 EAGLE-3 recipe, random weights), at `--rows` packed rows of each `--lengths`, one loss
forward and backward under the recipes' precision. Two ways alternate in one process:
"autograd" (the training-time-test attention holding its [s, s] scores, the draft head's soft
cross-entropy through autograd) and "fused" (the CPU flash kernel for that attention,
`architectures/ttt_attention.py`, and `train/fused_head_loss.py`); their medians, ratio and
tokens per second are printed. `--profile` adds the torch profiler's table of the fused step.
`--supervised F` supervises only the last share F of each packed sample (a ShareGPT row: ~0.67,
its user turns unsupervised), and `--ways fused all-read` sets the fused step beside one that
projects the target's final states at every position, as it did before the loss read only the
positions its steps score (`teacher_reads.read_positions`).

    python bench/eagle3_step_profile.py                       # 4 rows of 512 and of 1024
    python bench/eagle3_step_profile.py --lengths 1024 --profile
    python bench/eagle3_step_profile.py --lengths 1024 --supervised 0.67 --ways all-read fused
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import nullcontext

import torch
from teacher_reads_bench import step_seconds
from torch.profiler import ProfilerActivity, profile


def _setup(rows: int, length: int, supervised: float):
    import teacher_reads_bench as bench

    from draftzoo.data.batching import collate

    loss, model, _, states = bench._setup("eagle3")
    vocab = 49_152
    cut = [length // 3, length // 4, length - length // 3 - length // 4]
    mask = []
    for sample in cut:  # each sample's first share unsupervised, like a user's turn
        asked = round(sample * (1 - supervised))
        mask += [0] * asked + [1] * (sample - asked)
    batch = collate(
        [
            {
                "input_ids": torch.randint(0, vocab, (length,)).tolist(),
                "loss_mask": mask,
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
    import draftzoo.train.eagle_losses as eagle_losses

    fused_attention, whole_head = eagle.ttt_attention, eagle_batch._whole_head
    read_positions = eagle_losses.read_positions

    def autograd() -> None:
        eagle.ttt_attention, eagle_batch._whole_head = eagle.eager_ttt_attention, lambda m: None
        eagle_losses.read_positions = read_positions

    def fused() -> None:
        eagle.ttt_attention, eagle_batch._whole_head = fused_attention, whole_head
        eagle_losses.read_positions = read_positions

    def all_read() -> None:
        fused()
        eagle_losses.read_positions = lambda selects: torch.ones_like(selects[0], dtype=bool)

    return {"autograd": autograd, "fused": fused, "all-read": all_read}


_WAYS = ("autograd", "fused", "all-read")


def main() -> None:
    from draftzoo.train.precision import native_bf16

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--supervised", type=float, default=1.0)
    parser.add_argument("--ways", nargs=2, default=["autograd", "fused"], choices=_WAYS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bf16 = native_bf16(torch.device("cpu"))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
    every = _ways()
    ways = {way: every[way] for way in args.ways}
    slow_name, fast_name = args.ways
    print(
        f"{'tokens':>12} {slow_name + ' s':>10} {fast_name + ' s':>10} {'ratio':>6} "
        f"{fast_name + ' tokens/s':>18}"
    )
    for length in args.lengths:
        setup = _setup(args.rows, length, args.supervised)
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
            f"{args.rows:>4} x {length:<5} {slow:10.2f} {fast:10.2f} {slow / fast:6.2f} "
            f"{tokens / fast:18.0f}",
            flush=True,
        )
    precision = "bfloat16 autocast" if bf16 else "float32"
    print(
        f"{args.threads} threads, {precision}, {args.supervised:.0%} of each sample supervised, "
        f"medians of {args.repeats} alternating steps"
    )
    if args.profile:
        ways[fast_name]()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step_seconds(*setup, autocast)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
