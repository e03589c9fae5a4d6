"""What one decode step costs, piece by piece: eager forward vs CUDA-graph replay vs a round.

    python bench/forward_cost.py --device cuda

On the target (testbed-small unless --target), after a 200-token prefix: milliseconds of one
1-token eager forward on a transformers `DynamicCache`; one replay of the captured width-1
graph (`StaticForward`, one row); one `StaticForward.forward` (the replay plus its input
copies); and one target-only round of `SpeculativeGenerator` on the static cache (forward,
greedy acceptance with its host read, commit). Each is the mean of --steps timed calls after
warm-up, synchronised.

`--widths 1 5 13 61` adds what a verification forward of w tokens costs on a growing cache
(`GrowingForward`, eager, as the CPU runtime verifies), for a chain and for a tree of the same
size (explicit ancestor mask and depth positions), and its ratio to one token: a round of w
tokens pays off only when tau exceeds that ratio plus the drafting's share. On a float32 CPU
target the runtime verifies on its CPU kernels (`inference/cpu_kernels.py`); `--compare-kernels`
prints the stock kernels' costs beside them, alternating within each width.
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_target import load_target
from transformers import DynamicCache

from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.growing_forward import GrowingForward
from draftzoo.inference.kv_cache import cache_kwargs, crop
from draftzoo.inference.sampling import SamplingParams
from draftzoo.inference.static_forward import StaticForward
from draftzoo.inference.tree import Proposal
from draftzoo.train.testbed import committed_testbed_dir


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _mean_ms(step, steps: int, device) -> float:
    for _ in range(10):
        step()
    _sync(device)
    began = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return 1e3 * (time.perf_counter() - began) / steps


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(committed_testbed_dir()))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--widths", type=int, nargs="*", default=[], help="verification widths")
    parser.add_argument(
        "--compare-kernels", action="store_true", help="the stock kernels' costs beside them"
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    _, target = load_target(args.target, args.device)  # a path, or a name such as
    # smollm2-135m-instruct that `draftzoo target get` put in the cache
    prefix = torch.randint(0, target.config.vocab_size, (1, 200), device=device)
    token = prefix[:, -1:]

    cache = DynamicCache()
    target(input_ids=prefix, **cache_kwargs(target, cache))

    def eager_step():
        target(input_ids=token, **cache_kwargs(target, cache))
        crop(cache, 200)

    static = StaticForward(target, 1024)
    static.reset(1)
    static.forward(prefix, None, None)
    static.commit([list(range(200))])
    static.forward(token, None, None)  # captures width 1 on CUDA
    shape = static._shapes.get((1, 1))

    rows = {"eager forward, DynamicCache": _mean_ms(eager_step, args.steps, device)}
    if shape is not None and shape.call.graph is not None:
        rows["graph replay alone"] = _mean_ms(shape.call.graph.replay, args.steps, device)
    rows["StaticForward.forward (copies + replay)"] = _mean_ms(
        lambda: static.forward(token, None, None), args.steps, device
    )
    generator = SpeculativeGenerator(target, None, cache=CacheSettings(static=True))
    params = SamplingParams(max_new_tokens=args.steps)
    prompt = prefix[0].tolist()
    generator.generate(prompt, params)
    _sync(device)
    out = generator.generate(prompt, params)
    decode = out.metrics.total_seconds - out.metrics.prefill_seconds
    rows["target-only round, static cache"] = 1e3 * decode / out.metrics.num_target_forwards
    eager_generator = SpeculativeGenerator(target, None)
    eager_generator.generate(prompt, params)
    out = eager_generator.generate(prompt, params)
    decode = out.metrics.total_seconds - out.metrics.prefill_seconds
    rows["target-only round, DynamicCache"] = 1e3 * decode / out.metrics.num_target_forwards
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"one decode step of {args.target} on {name} (ms, mean of {args.steps})")
    for label, ms in rows.items():
        print(f"{label:42} {ms:8.3f}")
    if args.widths:
        kernels = CacheSettings().kernels_for(target)
        sides = {"runtime": kernels}
        if args.compare_kernels and kernels is not None:
            sides["stock"] = None
        verification_costs(target, prefix, args.widths, args.steps, device, sides)


def verification_costs(target, prefix, widths: list[int], steps: int, device, sides) -> None:
    """Eager verification forwards of w tokens after the 200-token prefix, chain and tree, on
    each of `sides` ({label: CpuKernels or None})."""
    ids = torch.randint(0, target.config.vocab_size, (1, max(widths)), device=device)
    forwards = {label: GrowingForward(target, kernels) for label, kernels in sides.items()}
    for forward in forwards.values():
        forward.reset(1)
        forward.forward(prefix, None, None, all_logits=False)
        forward.commit([list(range(prefix.shape[1]))])

    def verify(forward, width: int, tree: bool):
        nodes = width - 1
        if tree:  # a binary tree under the root (for w <= 2 it is a chain)
            proposal = Proposal([0] * nodes, [i // 2 - 1 for i in range(nodes)])
        else:
            proposal = Proposal.chain([0] * nodes)
        depths = ancestors = None
        if not proposal.is_chain:
            depths, ancestors = (t[None] for t in proposal.layout(device))

        def step():
            forward.forward(ids[:, :width], depths, ancestors)
            forward.rollback([prefix.shape[1]])

        return _mean_ms(step, steps, device)

    one = {label: verify(forward, 1, tree=False) for label, forward in forwards.items()}
    print("\nverification forward of w tokens, eager, growing cache (ms; x = ratio to w = 1)")
    for label, kernels in sides.items():
        print(f"  {label}: {'CPU kernels' if kernels is not None else 'stock kernels'}")
    print(f"{'w':>4} {'kernels':>8} {'chain':>9} {'x':>6} {'tree':>9} {'x':>6}")
    for width in widths:
        for label, forward in forwards.items():
            chain, tree = verify(forward, width, tree=False), verify(forward, width, tree=True)
            base = one[label]
            print(
                f"{width:4} {label:>8} {chain:9.3f} {chain / base:6.2f} {tree:9.3f} "
                f"{tree / base:6.2f}"
            )


if __name__ == "__main__":
    main()
