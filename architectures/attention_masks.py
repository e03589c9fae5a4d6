"""The prepared attention masks a target is handed: each layer type its own.

transformers uses a prepared (4D) mask as it is: it applies no sliding window to one. The
runtime passes prepared masks (rows at their own lengths, a tree's ancestors) and so do
packed training batches (one causal block per sample), so the window is applied here, by
position (a query at position p sees a key at position k when p - k < window, as
transformers' own sliding masks do): one mask for models whose every layer attends alike
(Llama; Mistral and Phi-3 with their window), a mask per layer type for models that mix full
and sliding layers (`config.layer_types`: Gemma 2/3, gpt-oss, Qwen2/3 with sliding layers),
the mapping those models accept in place of a mask.
"""

from __future__ import annotations

import torch

from .errors import TargetError

#: `config.layer_types` entries the runtime masks (every other kind is refused)
FULL, SLIDING = "full_attention", "sliding_attention"
#: the key of `attention_windows` for a model with one mask for every layer
EVERY_LAYER = ""


def attention_windows(config) -> dict[str, int | None]:
    """{layer type: its sliding window, None for full attention}; a model without
    `layer_types` has one entry, `EVERY_LAYER`, windowed by `config.sliding_window` (Mistral,
    Phi-3) or not. A layer type other than full or sliding attention is refused. A
    multimodal model's are its text decoder's."""
    getter = getattr(config, "get_text_config", None)
    config = getter(decoder=True) if getter else config
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is None:
        return {EVERY_LAYER: window}
    unknown = sorted(set(types) - {FULL, SLIDING})
    if unknown:
        raise TargetError(
            f"{config.model_type}: layer types {unknown} are not attention the runtime can mask "
            f"(it runs {FULL!r} and {SLIDING!r} layers)"
        )
    return {kind: (window if kind == SLIDING else None) for kind in set(types)}


def layer_masks(
    config,
    allowed: torch.Tensor,  # [R, w, K] bool: query a of row r may see key slot k
    query_positions: torch.Tensor,  # [R, w]
    key_positions: torch.Tensor,  # [R, K]
    dtype: torch.dtype,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Additive masks [R, 1, w, K]: one tensor, or {layer type: mask} for mixed layers."""
    windows = attention_windows(config)
    if all(window is None for window in windows.values()):
        windows = {EVERY_LAYER: None}
    masks, distance = {}, None
    for kind, window in windows.items():
        if window is not None and distance is None:
            distance = query_positions[:, :, None] - key_positions[:, None, :]
        seen = allowed if window is None else allowed & (distance < window)
        mask = torch.zeros(seen.shape, dtype=dtype, device=seen.device)
        masks[kind] = mask.masked_fill_(~seen, torch.finfo(dtype).min)[:, None]
    return masks.pop(EVERY_LAYER) if EVERY_LAYER in masks else masks


def windowed(config, mask: torch.Tensor, positions: torch.Tensor):
    """A prepared additive mask [b, 1, s, s] over positions [b, s] (a packed batch's causal
    blocks) as `layer_masks` gives it: unchanged where no layer has a window."""
    if all(window is None for window in attention_windows(config).values()):
        return mask
    return layer_masks(config, mask[:, 0] == 0, positions, positions, mask.dtype)
