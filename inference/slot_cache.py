"""KV caches on buffers allocated once, written at the slots their owner chooses.

A transformers `StaticCache` writes at a running count; the runtime needs to write a forward's
keys and values where its layout says (a row's next free slots, a tree's scratch slots) and to
read back only what a forward may attend. `RowSlots` is that choice, shared by every layer of
one cache: the rows and slots of the next write, and how many slots attention reads back
(None = all of them, what a captured CUDA graph needs; eager forwards read only up to their
last write, which keeps CPU decoding as cheap as a grown cache).
"""

from __future__ import annotations

import functools

import torch

from ..architectures.attention_masks import attention_windows
from .errors import GenerationError


class RowSlots:
    """Where the next keys go: row indices [R, 1] and slots [R, w]; and how many slots
    attention reads back (None = all)."""

    rows: torch.Tensor
    tensor: torch.Tensor
    limit: int | None = None


@functools.cache
def _row_slot_layer_class():
    """The slot-writing cache layer class (defined on first use: transformers is imported
    lazily)."""
    from transformers.cache_utils import StaticLayer

    class RowSlotLayer(StaticLayer):
        """A `StaticLayer` of `max_rows` rows, each written at the slots its owner chose."""

        def __init__(self, max_cache_len: int, max_rows: int, slots: RowSlots) -> None:
            super().__init__(max_cache_len=max_cache_len)
            self.max_rows, self.slots = max_rows, slots

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                rows = (self.max_rows, -1, -1, -1)
                self.lazy_initialization(key_states[:1].expand(rows), value_states[:1].expand(rows))
            where = (self.slots.rows, slice(None), self.slots.tensor)
            self.keys[where] = key_states.transpose(1, 2)
            self.values[where] = value_states.transpose(1, 2)
            count, limit = key_states.shape[0], self.slots.limit
            return self.keys[:count, :, :limit], self.values[:count, :, :limit]

    return RowSlotLayer


def slot_cache(config, size: int, max_rows: int, slots: RowSlots):
    """A transformers `StaticCache` of `max_rows` rows and `size` slots per row, whose layers
    write where `slots` says. Sliding-window layers keep every slot too (their window is
    applied by the forward's mask, `attention_masks.py`); models with layers other than
    attention are refused."""
    from transformers import StaticCache

    attention_windows(config)  # refuses layer types no mask serves
    cache = StaticCache(config=config, max_cache_len=size)
    kinds = {type(layer).__name__ for layer in cache.layers}
    if kinds - {"StaticLayer", "StaticSlidingWindowLayer"}:
        raise GenerationError(
            f"the static cache holds attention layers only; this model has {sorted(kinds)} "
            "(use the growing cache)"
        )
    layer_class = _row_slot_layer_class()
    cache.layers = [layer_class(size, max_rows, slots) for _ in cache.layers]
    return cache


def grow_slot_cache(cache, size: int) -> None:
    """Enlarge every layer of a `slot_cache` to `size` slots per row, keeping what it holds
    (buffers that follow the context; a captured CUDA graph would keep the old ones)."""
    for layer in cache.layers:
        layer.max_cache_len = size
        if not layer.is_initialized:
            continue
        more = size - layer.keys.shape[2]
        layer.keys = torch.cat(
            [layer.keys, layer.keys.new_zeros(*layer.keys.shape[:2], more, layer.keys.shape[3])], 2
        )
        layer.values = torch.cat(
            [
                layer.values,
                layer.values.new_zeros(*layer.values.shape[:2], more, layer.values.shape[3]),
            ],
            2,
        )


def static_nbytes(cache) -> int:
    """Bytes of a slot cache's allocated keys and values (every row and scratch slot)."""
    layers = [layer for layer in cache.layers if layer.is_initialized]
    return sum(2 * layer.keys.numel() * layer.keys.element_size() for layer in layers)
