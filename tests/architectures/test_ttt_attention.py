"""EAGLE-3's training-time-test attention on the CPU flash kernel: the values and gradients of
the eager form that holds every score, on packed rows, for 2-4 unrolled steps."""

from __future__ import annotations

import pytest
import torch

from draftzoo.architectures.eagle import eager_ttt_attention, ttt_attention
from draftzoo.architectures.ttt_attention import flash_ttt_attention


def _packed_mask() -> torch.Tensor:
    """[2, 1, 37, 37]: row 0 packs samples of 20 and 17 tokens, row 1 one of 37."""
    segment = torch.tensor([[0] * 20 + [1] * 17, [0] * 37])
    position = torch.arange(37)[None].expand(2, 37)
    causal = position[:, :, None] >= position[:, None, :]
    return (causal & (segment[:, :, None] == segment[:, None, :]))[:, None]


def _grads(attention, q, keys, values, mask, grad):
    out = attention(q, keys, values, mask)
    return out, torch.autograd.grad(out, [q, *keys, *values], grad)


@pytest.mark.parametrize("steps", [2, 3, 4])
def test_flash_equals_the_eager_form(steps):
    torch.manual_seed(steps)
    shape = (2, 3, 37, 16)
    q = torch.randn(shape, requires_grad=True)
    keys = [torch.randn(shape, requires_grad=True) for _ in range(steps)]
    values = [torch.randn(shape, requires_grad=True) for _ in range(steps)]
    grad = torch.randn(shape)
    mask = _packed_mask()
    out, grads = _grads(flash_ttt_attention, q, keys, values, mask, grad)
    want_out, want_grads = _grads(eager_ttt_attention, q, keys, values, mask, grad)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the drafter's forward takes the flash form on the CPU
    torch.testing.assert_close(ttt_attention(q, keys, values, mask), out, rtol=0, atol=0)


def test_under_autocast_it_runs_in_the_autocast_dtype():
    """Rotary embeddings leave q and k in float32 while v is bfloat16: both forms compute in
    bfloat16 under autocast, return the queries' dtype and agree to bfloat16's rounding."""
    torch.manual_seed(0)
    shape = (2, 3, 37, 16)
    q = torch.randn(shape, requires_grad=True)
    keys = [torch.randn(shape, requires_grad=True) for _ in range(3)]
    values = [torch.randn(shape, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    grad = torch.randn(shape, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, grads = _grads(flash_ttt_attention, q, keys, values, _packed_mask(), grad)
        want_out, want_grads = _grads(eager_ttt_attention, q, keys, values, _packed_mask(), grad)
    assert out.dtype == want_out.dtype == torch.float32
    torch.testing.assert_close(out, want_out, rtol=0.05, atol=0.05)
    for got, want in zip(grads, want_grads, strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.05)
