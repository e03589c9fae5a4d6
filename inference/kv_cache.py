"""Rolling a transformers `DynamicCache` back to the accepted path."""

from __future__ import annotations

import functools
import inspect

import torch


@functools.cache
def _cache_argument(model_type: type) -> str:
    forward = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in forward else "past_key_values"


def cache_kwargs(model, cache) -> dict:
    """Forward kwargs passing `cache` under the name this transformers version uses."""
    return {_cache_argument(type(model)): cache, "use_cache": True}


def cache_length(cache) -> int:
    """Tokens held by the cache (0 for None)."""
    return 0 if cache is None else cache.get_seq_length()


def _layers(cache):
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"unsupported cache type {type(cache).__name__}: expected a DynamicCache")
    for layer in layers:
        if type(layer).__name__ != "DynamicLayer":
            raise TypeError(
                f"cache layer {type(layer).__name__} cannot be rolled back; "
                "sliding-window and quantized caches are not supported"
            )
    return layers


def crop(cache, length: int) -> None:
    """Keep the first `length` positions (chains: drop rejected draft tokens)."""
    for layer in _layers(cache):
        layer.keys = layer.keys[..., :length, :]
        layer.values = layer.values[..., :length, :]


def keep_tail(cache, start: int, tail_slots: list[int]) -> None:
    """Keep positions [0, start) plus `start + s` for s in `tail_slots`, in that order (trees)."""
    index = torch.tensor(tail_slots, dtype=torch.long)
    for layer in _layers(cache):
        index = index.to(layer.keys.device)
        layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys[..., start + index, :]], -2)
        layer.values = torch.cat(
            [layer.values[..., :start, :], layer.values[..., start + index, :]], -2
        )
