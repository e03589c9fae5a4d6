"""Verification forwards at the price of a decode step on a CPU: packed weights, grouped-query
attention in place.

A verification forward feeds 2..64 tokens where a decode step feeds one. On a CPU both read
every weight once from memory, so they could cost about the same; with the stock kernels they
do not (SmolLM2-135M, two cores, float32: 5 tokens cost ~1.9 one-token steps). Two causes,
each fixed here for the target's verification forwards only (prefill and one-token steps run
exactly as before, so target-only decoding is untouched):

- **Matrix products.** `F.linear` over 4-64 rows calls MKL's general GEMM, which packs the
  weight again on every call. MKL's packed GEMM (`torch.ops.mkl._mkl_linear`, the kernel
  inductor's freezing uses on CPUs) packs it once: every `nn.Linear` of the target (of at
  least `MIN_PACKED_ELEMENTS` weights) runs such rows, padded with zeros to the next width of
  `WIDTHS`, on a copy packed for that width. Each width used holds one packed copy of the
  weights (the model's float32 size again).
- **Attention.** With a mask (every forward of more than one token over a cache),
  transformers' SDPA path copies each key/value head out to its query heads before calling
  the kernel; on a CPU the kernel takes grouped-query heads with a mask in place
  (`enable_gqa=True`, bitwise equal, torch >= 2.5).

Products over a packed weight round differently from `F.linear` (float32: ~1e-5 on logits),
as any two GEMM kernels do; a verification forward already differs so from a decode step.
Greedy output identical to target-only is checked by the tests and every evaluation.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
import torch.nn.functional as F

#: row counts a packed copy is made for; a forward of r rows runs on the smallest >= r
WIDTHS = (8, 16, 32, 64)
#: fewer rows run on `F.linear`, whose GEMM takes them without repacking the weight
MIN_PACKED_ROWS = 4
#: smaller weights (256 KB in float32) stay on `F.linear`: they sit in the CPU's caches, where
#: repacking them costs less than padding and a second call
MIN_PACKED_ELEMENTS = 65_536

ATTENTION = "draftzoo_cpu_sdpa"  # the attention implementation's registered name

#: what a report says of verification forwards that ran here
NOTE = "packed weights (MKL) and grouped-query attention in place"


def unavailable_reason(model) -> str | None:
    """Why `model`'s verification forwards cannot take these kernels, or None."""
    parameter = next(model.parameters())
    if parameter.device.type != "cpu":
        return f"the target is on {parameter.device.type}, not a CPU"
    if parameter.dtype != torch.float32:
        return f"the target's weights are {parameter.dtype}, not float32"
    if not (torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")):
        return "this torch has no MKL (packed GEMM)"
    return None


def _width_for(rows: int) -> int | None:
    return next((width for width in WIDTHS if rows <= width), None)


def _gqa_sdpa(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """transformers' SDPA attention with grouped-query heads read in place under a mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if attention_mask is None or groups == 1 or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, _gqa_sdpa)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


class CpuKernels:
    """The packed copies of one model's weights and the switch that routes its verification
    forwards through them (`active`)."""

    def __init__(self, model) -> None:
        reason = unavailable_reason(model)
        if reason is not None:
            raise ValueError(f"CPU verification kernels: {reason}")
        self._packed: dict[tuple[int, int], tuple[torch.Tensor, int, int]] = {}
        self._pads: dict[tuple, torch.Tensor] = {}
        # modules whose forward someone already replaced (hooks of accelerate, peft...) keep it
        self.linears = [
            m
            for m in model.modules()
            if type(m) is torch.nn.Linear
            and "forward" not in vars(m)
            and m.weight.numel() >= MIN_PACKED_ELEMENTS
        ]
        self._forwards = [self._linear_forward(m) for m in self.linears]
        configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
        self.configs = [
            c for c in configs.values() if getattr(c, "_attn_implementation", None) == "sdpa"
        ]
        _register_attention()

    def packed_bytes(self) -> int:
        """Bytes the packed copies hold (allocated; MKL fills about a quarter of each)."""
        return sum(p.numel() * p.element_size() for p, _, _ in self._packed.values())

    def _packed_weight(self, linear: torch.nn.Linear, width: int) -> torch.Tensor:
        weight = linear.weight
        stamp = (weight.data_ptr(), weight._version)
        held = self._packed.get((id(linear), width))
        if held is None or held[1:] != stamp:
            packed = torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), width)
            held = self._packed[(id(linear), width)] = (packed, *stamp)
        return held[0]

    def _padded(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """`rows` [r, features] in a buffer of `width` rows, zeros below (one buffer per
        shape, shared by the layers: their calls never overlap)."""
        key = (rows.shape[1], width, rows.dtype)
        buffer = self._pads.get(key)
        if buffer is None:
            buffer = self._pads[key] = rows.new_zeros(width, rows.shape[1])
        buffer[: len(rows)].copy_(rows)
        buffer[len(rows) :].zero_()
        return buffer

    def _linear_forward(self, linear: torch.nn.Linear):
        def forward(x: torch.Tensor) -> torch.Tensor:
            rows = math.prod(x.shape[:-1])
            width = _width_for(rows)
            small = rows < MIN_PACKED_ROWS or width is None
            if small or torch.is_grad_enabled() or x.dtype != linear.weight.dtype:
                return F.linear(x, linear.weight, linear.bias)
            flat = x.reshape(rows, x.shape[-1])
            if rows < width:
                flat = self._padded(flat, width)
            packed = self._packed_weight(linear, width)
            out = torch.ops.mkl._mkl_linear(flat, packed, linear.weight, linear.bias, width)
            return out[:rows].reshape(*x.shape[:-1], out.shape[-1])

        return forward

    @contextmanager
    def active(self) -> Iterator[None]:
        """Within: the model's linear layers take packed weights, its attention in-place
        grouped-query heads; both put back on leaving, whatever happens."""
        for linear, forward in zip(self.linears, self._forwards, strict=True):
            vars(linear)["forward"] = forward  # an instance attribute, as nn.Module sets one
        for config in self.configs:
            config._attn_implementation = ATTENTION
        try:
            yield
        finally:
            for linear in self.linears:
                vars(linear).pop("forward", None)
            for config in self.configs:
                config._attn_implementation = "sdpa"


_SHARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def shared_kernels(model) -> CpuKernels:
    """The one `CpuKernels` of `model`: every generator over it verifies on the same packed
    copies (kept while the model lives)."""
    kernels = _SHARED.get(model)
    if kernels is None:
        kernels = _SHARED[model] = CpuKernels(model)
    return kernels


def verifying(
    kernels: CpuKernels | None, width: int, all_logits: bool
) -> AbstractContextManager[None]:
    """The context a forward of `width` tokens runs in: the kernels for a verification
    (every position's logits, more than one token), nothing otherwise."""
    if kernels is not None and all_logits and width > 1:
        return kernels.active()
    return nullcontext()
