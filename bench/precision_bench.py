"""What bf16 autocast costs on this machine: matrix products in bf16 against float32, side by side.

    python bench/precision_bench.py --threads 1

Times the products a testbed-small drafter's training step is made of (rows x in -> out, the
step's 4 x 256 positions) in float32, under bf16 autocast (`F.linear`, as the drafter calls it)
and as a plain bf16 `x @ w` on a transposed weight, interleaved in one process, and prints each
one's time and its ratio to float32, with what
`draftzoo.train.precision` decides for `mixed_precision: auto` here. On a CPU without native
bf16 (no AVX512-BF16 or AMX) the bf16 products are emulated; there `auto` trains in float32.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from draftzoo.train.precision import native_bf16, resolve_mixed_precision

#: (rows, in features, out features): the drafter's fc, attention, MLP and draft head
SHAPES = ((1024, 768, 256), (1024, 512, 256), (1024, 256, 768), (1024, 768, 768), (1024, 256, 4096))


def _time(fn, repeats: int) -> float:
    fn()
    began = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - began) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median kept)")
    parser.add_argument("--repeats", type=int, default=5, help="products per timing")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    print(
        f"cpu: native bf16 {native_bf16(cpu)}; mixed_precision auto -> "
        f"{resolve_mixed_precision('auto', cpu)}; {torch.get_num_threads()} threads"
    )
    torch.manual_seed(0)
    print(
        f"{'rows x in -> out':>20} {'float32 ms':>11} {'autocast ms':>12} {'ratio':>6} "
        f"{'bf16 x @ w ms':>14} {'ratio':>6}"
    )
    for rows, fan_in, fan_out in SHAPES:
        x, w = torch.randn(rows, fan_in), torch.randn(fan_out, fan_in)
        xb, wb = x.bfloat16(), w.t().contiguous().bfloat16()

        def autocast(x=x, w=w):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return torch.nn.functional.linear(x, w)

        runs = {
            "float32": lambda x=x, w=w: torch.nn.functional.linear(x, w),
            "autocast": autocast,
            "bf16": lambda xb=xb, wb=wb: xb @ wb,
        }
        times = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, fn in runs.items():
                times[name].append(_time(fn, args.repeats))
        ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
        print(
            f"{f'{rows} x {fan_in} -> {fan_out}':>20} {ms['float32']:11.2f} "
            f"{ms['autocast']:12.2f} {ms['autocast'] / ms['float32']:5.1f}x "
            f"{ms['bf16']:14.2f} {ms['bf16'] / ms['float32']:5.1f}x"
        )


if __name__ == "__main__":
    main()
