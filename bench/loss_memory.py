"""Peak memory of one training step's loss at 2k / 4k / 8k tokens, chunked and unchunked.

SmolLM2-135M-Instruct's shapes (hidden 576, vocabulary 49,152) with two target layers (the loss
does not depend on the depth) and the SmolLM2 recipes' drafters, random weights, one row of
`length` tokens, every position supervised. Each measurement runs in a fresh process: its
resident set after building everything, then its peak resident set after one loss forward and
backward; the difference is printed. A step whose peak stayed under what the set-up already
reached prints as an upper bound (<=).

    python bench/loss_memory.py                      # draft_lm eagle1 mtp, 2048 4096 8192
    python bench/loss_memory.py --families eagle1 --lengths 8192 --chunk 512
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "recipes/model_configs/HuggingFaceTB__SmolLM2-135M-Instruct.json"


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _setup(family: str, length: int, chunk: int | None):
    """(loss, model, batch, states) of `family` at `length` tokens."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftzoo.architectures.target import TargetAdapter
    from draftzoo.data.batching import collate
    from draftzoo.train.registry import load_recipe

    config = LlamaConfig.from_json_file(str(CONFIG))
    config.num_hidden_layers = 2
    torch.manual_seed(0)
    target = TargetAdapter(LlamaForCausalLM(config).eval())
    target.requires_grad_(False)
    recipe = load_recipe(ROOT / f"recipes/{family}/smollm2-135m-instruct.yaml")
    vocab = config.vocab_size
    row = {
        "input_ids": torch.randint(0, vocab, (length,)).tolist(),
        "loss_mask": [1] * length,
        "lengths": [length],
        "index": 0,
    }
    batch = collate([row], 0)
    loss, model, layers = family_loss(family, target, recipe, chunk)
    states = {layer: torch.randn(1, length, config.hidden_size) for layer in layers}
    return loss, model.train(), batch, states


def family_loss(family: str, target, recipe, chunk: int | None):
    """(the family's loss, a fresh drafter for `target` built by `recipe`, the target layers
    its loss reads), for the families these benches measure."""
    if family == "draft_lm":
        from draftzoo.architectures.draft_lm import build_draft_lm
        from draftzoo.train.draft_lm_loss import DraftLMLoss

        model = build_draft_lm(recipe.draft, target.model)
        loss = DraftLMLoss(recipe.distill, target, None, chunk)
        layers = [target.num_layers]
    elif family in ("eagle1", "eagle3"):  # the recipe says which
        from draftzoo.architectures.eagle import build_eagle
        from draftzoo.train.eagle_batch import EagleLoss

        model = build_eagle(recipe.eagle, target)
        loss = EagleLoss(recipe.eagle, model, target, None, chunk)
        layers = sorted({*model.layers, target.num_layers})
    elif family == "mtp":
        from draftzoo.architectures.mtp import build_mtp
        from draftzoo.train.mtp_loss import MtpLoss

        model = build_mtp(recipe.mtp, target)
        loss = MtpLoss(recipe.mtp, target, None, chunk)
        layers = [target.num_layers]
    elif family == "medusa1":
        from draftzoo.architectures.medusa import build_medusa
        from draftzoo.train.medusa_loss import MedusaLoss

        model = build_medusa(recipe.medusa, target)
        loss = MedusaLoss(recipe.loss, recipe.medusa.num_heads, target, None, chunk)
        layers = [target.num_layers]
    else:
        raise SystemExit(f"unknown family {family}")
    return loss, model, layers


def measure_one(family: str, length: int, chunk: int | None) -> dict:
    """One step's peak resident-set increase in this process."""
    import torch

    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    loss, model, batch, states = _setup(family, length, chunk)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    before, setup_peak = _rss(), _peak()
    total, _ = loss(model, batch, states)
    total.backward()
    peak = _peak()
    return {
        "family": family,
        "length": length,
        "chunk": chunk,
        "increase_mb": (peak - before) / 2**20,
        "bound": peak <= setup_peak,  # the step never rose above the set-up's own peak
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["draft_lm", "eagle1", "mtp"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[2048, 4096, 8192])
    parser.add_argument("--chunk", type=int, default=1024, help="rows per chunk (the default)")
    parser.add_argument(
        "--one", nargs=3, metavar=("FAMILY", "LENGTH", "CHUNK"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.one:
        family, length, chunk = args.one
        print(json.dumps(measure_one(family, int(length), None if chunk == "none" else int(chunk))))
        return
    print(f"{'family':9} {'tokens':>6}  {'unchunked MB':>13}  {'chunked MB':>11}  {'ratio':>6}")
    for family in args.families:
        for length in args.lengths:
            got = {}
            for chunk in ("none", str(args.chunk)):
                command = [sys.executable, __file__, "--one", family, str(length), chunk]
                out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
                got[chunk] = json.loads(out.strip().splitlines()[-1])
            plain, chunked = got["none"], got[str(args.chunk)]
            shown = [
                ("<=" if r["bound"] else "") + f"{r['increase_mb']:.0f}" for r in (plain, chunked)
            ]
            ratio = chunked["increase_mb"] / plain["increase_mb"]
            print(
                f"{family:9} {length:6d}  {shown[0]:>13}  {shown[1]:>11}  {ratio:6.2f}", flush=True
            )
    print(f"chunk: {args.chunk} rows; {os.environ.get('THREADS', '2')} threads")


if __name__ == "__main__":
    main()
