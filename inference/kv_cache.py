"""Rolling a transformers `DynamicCache` back to the accepted path."""

from __future__ import annotations

import torch

from ..architectures.target import cache_parameter, forward_parameters


def cache_kwargs(model, cache, last_logits_only: bool = False) -> dict:
    """Forward kwargs passing `cache` under the name this transformers version uses.

    `last_logits_only` asks for the last position's logits alone (prefill, draft catch-up)
    where the model supports `logits_to_keep`.
    """
    kwargs = {cache_parameter(type(model)): cache, "use_cache": True}
    if last_logits_only and "logits_to_keep" in forward_parameters(type(model)):
        kwargs["logits_to_keep"] = 1
    return kwargs


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


def cache_nbytes(cache) -> int:
    """Bytes held by a DynamicCache's keys and values (0 for None or an empty cache)."""
    if cache is None:
        return 0
    total = 0
    for layer in getattr(cache, "layers", []):
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
    return total


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
