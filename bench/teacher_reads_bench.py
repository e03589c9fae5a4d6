"""Step time with the target read once per micro-batch against once per step or head.

SmolLM2-135M-Instruct's shapes (hidden 576, vocabulary 49,152; three target layers with
random weights, since the loss does not depend on the depth; EAGLE-3 taps 2, 1, 0), the
SmolLM2 recipes' EAGLE-3 and Medusa-1 (draft vocabulary 8,192), 4 packed rows of 512 tokens,
one loss forward and backward under the recipes' precision (bfloat16 autocast where the CPU
multiplies it natively). The two ways alternate in one process; the median of each is printed
with their ratio.

    python bench/teacher_reads_bench.py                 # eagle3 medusa1, 5 repeats
    python bench/teacher_reads_bench.py --families eagle3 --repeats 9
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import torch
from loss_memory import CONFIG, ROOT, family_loss


def _setup(family: str):
    """(loss, model, batch, states) of `family` on 4 packed rows of 512 tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftzoo.architectures.target import TargetAdapter
    from draftzoo.data.batching import collate
    from draftzoo.train.registry import load_recipe

    config = LlamaConfig.from_json_file(str(CONFIG))
    config.num_hidden_layers = 3  # EAGLE-3's default taps (2, N // 2, N - 3): 2, 1, 0
    torch.manual_seed(0)
    target = TargetAdapter(LlamaForCausalLM(config).eval())
    target.requires_grad_(False)
    recipe = load_recipe(ROOT / f"recipes/{family}/smollm2-135m-instruct.yaml")
    vocab = config.vocab_size
    rows = [
        {
            "input_ids": torch.randint(0, vocab, (512,)).tolist(),
            "loss_mask": [1] * 512,
            "lengths": [200, 150, 162],
            "index": i,
        }
        for i in range(4)
    ]
    batch = collate(rows, 0)
    loss, model, layers = family_loss(family, target, recipe, recipe.train.loss_chunk_rows)
    states = {layer: torch.randn(4, 512, config.hidden_size) for layer in layers}
    if family == "medusa1":
        states = states[target.num_layers]
    return loss, model.train(), batch, states


def step_seconds(loss, model, batch, states, autocast) -> float:
    began = time.perf_counter()
    with autocast:
        total, _ = loss(model, batch, states)
    total.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - began


def main() -> None:
    import draftzoo.train.eagle_losses as eagle_losses
    import draftzoo.train.medusa_loss as medusa_loss
    from draftzoo.train.precision import native_bf16

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["eagle3", "medusa1"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bf16 = native_bf16(torch.device("cpu"))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
    once = eagle_losses.read_teacher_once
    ways = {"once": once, "per step": lambda *a: None}
    print(f"{'family':8} {'once s':>7} {'per step s':>10} {'ratio':>6}")
    for family in args.families:
        setup = _setup(family)
        times: dict[str, list[float]] = {way: [] for way in ways}
        for repeat in range(args.repeats + 1):  # the first of each is a warm-up
            for way, reader in ways.items():
                eagle_losses.read_teacher_once = medusa_loss.read_teacher_once = reader
                seconds = step_seconds(*setup, autocast)
                if repeat:
                    times[way].append(seconds)
        eagle_losses.read_teacher_once = medusa_loss.read_teacher_once = once
        a, b = (statistics.median(times[way]) for way in ways)
        print(f"{family:8} {a:7.2f} {b:10.2f} {a / b:6.2f}", flush=True)
    precision = "bfloat16 autocast" if bf16 else "float32"
    print(f"{args.threads} threads, {precision}, medians of {args.repeats} alternating steps")


if __name__ == "__main__":
    main()
