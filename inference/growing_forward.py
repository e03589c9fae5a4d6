"""Forwards of one causal LM over a growing `DynamicCache`, each row at its own length.

Batch-1 decoding is the one-row case of batched decoding. The cache is [rows, heads, slots,
dim] and kept *compact*: after every commit each row's valid slots are gathered to the front,
and dropped rows are gathered away. A forward appends R x w slots after the widest row; row
r's queries see its slots [0, lengths[r]) and its own ancestors among the new ones, at
positions `lengths[r] + depth`. One row needs no gather: a chain's rejected tail is cropped, a
tree's accepted path is moved down (`kv_cache.keep_tail`), and a chain forward runs with the
model's own causal mask. `StaticForward` (`static_forward.py`) is the same interface over
buffers allocated once.
"""

from __future__ import annotations

import torch

from ..architectures.attention_masks import layer_masks
from .cpu_kernels import CpuKernels, verifying
from .kv_cache import _layers, cache_kwargs, cache_nbytes, crop, keep_tail
from .transfer import to_device


def _gather(cache, rows: torch.Tensor, slots: torch.Tensor) -> None:
    """Keep cache rows `rows` [R] and, per kept row, slots `slots` [R, W] (in that order)."""
    for layer in _layers(cache):
        layer.keys = _gather_slots(layer.keys[rows], slots)
        layer.values = _gather_slots(layer.values[rows], slots)


def _gather_slots(tensor: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Per row, slots `slots` [R, W] of `tensor` [R, heads, slots, dim] (keys and values may
    differ in heads and dim: MLA's keys and values do)."""
    index = slots.to(tensor.device)[:, None, :, None]
    return torch.gather(tensor, 2, index.expand(-1, tensor.shape[1], -1, tensor.shape[3]))


class GrowingForward:
    """Forwards of `model` over a growing cache; see the module docstring."""

    def __init__(self, model, kernels: CpuKernels | None = None) -> None:
        """`kernels`: the CPU kernels its verification forwards run on (None: the stock)."""
        self.model = model.eval()
        self.kernels = kernels
        self.device = next(model.parameters()).device
        self.cache = None
        self.lengths: list[int] = []  # committed positions of each live row
        self._width = 0  # slots before the last forward's

    def reset(self, rows: int) -> None:
        """Start `rows` new sequences."""
        from transformers import DynamicCache

        self.cache, self.lengths = DynamicCache(), [0] * rows

    def nbytes(self) -> int:
        """Bytes the cache holds now (the last forward's uncommitted slots included)."""
        return cache_nbytes(self.cache)

    def forward(
        self,
        input_ids: torch.Tensor,  # [R, w] on the model's device, R = the live rows
        depths: torch.Tensor | None,  # [R, w] positions relative to each row's length
        ancestors: torch.Tensor | None,  # [R, w, w] bool: in row r, a attends b; None: chains
        captured: dict | None = None,  # unused: hooks refresh it on every eager forward
        all_logits: bool = True,  # False: the last position's only (prefill)
    ) -> torch.Tensor:
        """Logits [R, w, vocab]."""
        with verifying(self.kernels, input_ids.shape[1], all_logits):
            return self._forward(input_ids, depths, ancestors, all_logits)

    def _forward(self, input_ids, depths, ancestors, all_logits) -> torch.Tensor:
        rows, width = input_ids.shape
        self._width = self.cache.get_seq_length()
        kwargs = cache_kwargs(self.model, self.cache, not all_logits)
        if ancestors is None and rows == 1:  # one chain after a compact row: plain causal
            return self.model(input_ids=input_ids, **kwargs).logits
        if ancestors is None:
            ancestors = torch.ones(width, width, dtype=torch.bool).tril().repeat(rows, 1, 1)
            depths = torch.arange(width).repeat(rows, 1)
        lengths = to_device(self.lengths, self.device)[:, None]
        past = torch.arange(self._width, device=self.device) < lengths  # [R, width]
        allowed = torch.cat(
            [past[:, None].expand(-1, width, -1), ancestors.to(self.device)], dim=-1
        )
        positions = depths.to(self.device) + lengths
        slots = torch.arange(self._width, device=self.device).expand(rows, -1)
        mask = layer_masks(
            self.model.config,
            allowed,
            positions,
            torch.cat([slots, positions], dim=-1),
            self.model.dtype,
        )
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, **kwargs)
        return out.logits

    def commit(self, kept: list[list[int]]) -> None:
        """Keep, in row r, the last forward's slots `kept[r]` (relative, in order)."""
        if len(kept) == 1:  # one compact row: crop, or move a tree's path down in place
            (row,) = kept
            if row == list(range(len(row))):
                crop(self.cache, self._width + len(row))
            else:
                keep_tail(self.cache, self._width, row)
            self.lengths = [self._width + len(row)]
            return
        slots = [
            list(range(length)) + [self._width + s for s in row_kept]
            for length, row_kept in zip(self.lengths, kept, strict=True)
        ]
        self.lengths = [len(s) for s in slots]
        self._keep(list(range(len(slots))), slots)

    def rollback(self, lengths: list[int]) -> None:
        """Forget, in row r, every position from `lengths[r]` on."""
        lengths = [min(old, new) for old, new in zip(self.lengths, lengths, strict=True)]
        if len(lengths) == 1:
            crop(self.cache, lengths[0])
        elif lengths != self.lengths:
            self._keep(list(range(len(lengths))), [list(range(n)) for n in lengths])
        self.lengths = lengths

    def keep_rows(self, rows: list[int]) -> None:
        """Keep the live rows `rows` (in that order)."""
        if rows != list(range(len(self.lengths))):
            self.lengths = [self.lengths[r] for r in rows]
            self._keep(rows, [list(range(length)) for length in self.lengths])

    def repeat(self, rows: int) -> None:
        """Row 0 repeated `rows` times (one prompt prefilled once for several requests)."""
        if self.lengths[0] > 0:
            self.cache.batch_repeat_interleave(rows)
        self.lengths = self.lengths[:1] * rows

    def _keep(self, rows: list[int], slots: list[list[int]]) -> None:
        wide = max(len(s) for s in slots)
        if wide == 0:
            return
        padded = [s + [0] * (wide - len(s)) for s in slots]
        _gather(self.cache, torch.tensor(rows), torch.tensor(padded))
