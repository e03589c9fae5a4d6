"""One MTP module forward after 290 cached entries, before and after the slot cache: the
earlier growing path (a transformers DynamicCache, fed and cropped back each time; replicated
here) against `ModuleSlots.forward` on a growing slot cache. 200 forwards each, 2 threads.

    python bench/results/cpu-2026-12-06-mtp-slots/forward_microbench.py
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from draftzoo.architectures.zoo_index import resolve_drafter
from draftzoo.inference.cache_settings import GROWING
from draftzoo.inference.kv_cache import _layers
from draftzoo.inference.load import load_target
from draftzoo.inference.proposers.mtp import MtpProposer
from draftzoo.inference.proposers.mtp_slots import ModuleSlots

CACHED, REPS = 290, 200


def _dynamic_feed(drafter, cache, previous, ids, first: int) -> torch.Tensor:
    """Module 0 over `ids` from `first` on a DynamicCache, as the growing path fed it."""
    n, mask = len(ids), None
    if n > 1:
        total = cache.get_seq_length(0) + n
        mask = torch.ones(n, total, dtype=torch.bool).tril(total - n)[None, None]
    positions = torch.arange(first, first + n)[None]
    return drafter.module(0, ids[None], previous[None], positions, mask, cache)[0]


@torch.no_grad()
def seconds_per_forward(drafter, kind: str, width: int, ids, states) -> float:
    head = (ids[:CACHED], states[:CACHED])
    new = (ids[CACHED : CACHED + width], states[CACHED : CACHED + width])
    if kind == "before":
        cache = DynamicCache()
        _dynamic_feed(drafter, cache, head[1], head[0], 0)
        start = time.perf_counter()
        for _ in range(REPS):
            _dynamic_feed(drafter, cache, new[1], new[0], CACHED)
            for layer in _layers(cache):  # the crop back to the real entries
                if getattr(layer, "keys", None) is not None:
                    layer.keys, layer.values = (
                        layer.keys[..., :CACHED, :],
                        layer.values[..., :CACHED, :],
                    )
        return (time.perf_counter() - start) / REPS
    slots = ModuleSlots(drafter, GROWING)
    slots.forward(0, head[0], head[1], 0)
    start = time.perf_counter()
    for _ in range(REPS):
        slots.forward(0, new[0], new[1], CACHED)
    return (time.perf_counter() - start) / REPS


def main() -> None:
    torch.set_num_threads(2)
    model, tokenizer = load_target("testbed-small")
    drafter = MtpProposer.from_pretrained(
        resolve_drafter("mtp-testbed-small")[0], model, tokenizer
    ).drafter
    ids = torch.randint(0, 1000, (CACHED + 10,))
    states = torch.randn(CACHED + 10, drafter.fields["hidden_size"])
    for width in (1, 3):
        for _ in range(2):
            for kind in ("before", "after"):
                ms = 1000 * seconds_per_forward(drafter, kind, width, ids, states)
                print(f"{kind:6} width {width}: {ms:.3f} ms")


if __name__ == "__main__":
    main()
