"""Vocabulary-sized losses computed a chunk of rows at a time.

A family's loss projects drafter states [n, h] to logits [n, V] and compares them with the
target's distribution, itself its head over the target's final states. All of that is per row,
so `rowwise` runs it on `chunk` rows at a time: without gradients each chunk's logits are freed
before the next, and with gradients each chunk runs under activation checkpointing
(`torch.utils.checkpoint`, non-reentrant), which keeps only the chunk's inputs and recomputes
its logits in the backward pass. Peak memory then holds one chunk's [chunk, V] logits instead of
every row's; the values are the unchunked ones (tests/train/test_chunked_loss.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.utils.checkpoint import checkpoint

RowFn = Callable[..., tuple[torch.Tensor, ...]]


def rowwise(fn: RowFn, rows: Sequence[torch.Tensor], chunk: int | None) -> tuple[torch.Tensor, ...]:
    """`fn(*rows)` (a tuple of per-row tensors, first dimension n) computed `chunk` rows at a
    time and concatenated; `chunk` None: all rows at once. In a distributed run every rank
    runs as many chunks as the rank with the most rows (the extra ones empty): ZeRO-3 gathers
    a module's weights at each call, and every rank must make the same calls."""
    n = rows[0].shape[0]
    count = _chunks_on_every_rank(n, chunk, rows[0].device)
    if count == 1:
        return fn(*rows)
    grad = torch.is_grad_enabled()
    parts = []
    for lo in range(0, count * chunk, chunk):
        piece = [t[lo : lo + chunk] for t in rows]
        if grad:
            parts.append(checkpoint(fn, *piece, use_reentrant=False))
        else:
            parts.append(fn(*piece))
    return tuple(torch.cat(column) for column in zip(*parts, strict=True))


def _chunks_on_every_rank(n: int, chunk: int | None, device) -> int:
    """How many chunks this call runs: the most any rank needs (1 when unchunked)."""
    if chunk is None:
        return 1
    count = max(1, -(-n // chunk))
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        most = torch.tensor([count], device=device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        count = int(most.item())
    return count
