"""A draft head's soft cross-entropy fused with its gradient, a block of rows at a time.

EAGLE-3's token loss projects a step's states x [n, h] with the draft head W [K, h] and scores
the logits against the target's distribution over the same K tokens. Through autograd that
keeps (or, chunked, recomputes) [n, K] logits and runs a dozen passes over them; on two CPU
cores those passes, each allocating a fresh [n, K] float32 tensor, took most of a SmolLM2 step.
`head_soft_ce` instead works on `BLOCK` rows at a time, small enough to stay in cache, and
computes each block's gradient with its loss, the way fused linear cross-entropy kernels do:

    loss_row = sum_x p(x) (lse(z) - z_x),  dz = (softmax(z) sum_x p(x) - p) x keep

with z = x W^T in the compute dtype (bfloat16 under autocast, as autograd's linear would), p
the target's softmax over the kept tokens, keep whether the target's own argmax is among them.
dx = dz W and dW = dz^T x are kept, and the backward only scales them by the incoming gradient
of the summed loss. Values and gradients are autograd's up to float rounding
(tests/train/test_fused_head_loss.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: rows per block: [BLOCK, K] float32 logits stay in cache for draft vocabularies of ~8k
BLOCK = 256

#: rows -> (the target's argmax over its whole vocabulary [r], its logits on the kept tokens [r, K])
TeacherRows = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def head_soft_ce(
    x: torch.Tensor,  # [n, h] the normed states the head reads
    weight: torch.Tensor,  # [K, h] the draft head
    teacher: TeacherRows,  # the target's reads for a block of `rows`
    rows: torch.Tensor,  # [n] what `teacher` is asked for, per row of x
    d2t: torch.Tensor,  # [K] draft id -> target id offset
    t2d: torch.Tensor,  # [V] bool: target ids in the draft vocabulary
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the summed soft cross-entropy, differentiable in x and weight; [n] bool: the head's
    argmax is the target's)."""
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    loss, correct = _HeadSoftCE.apply(x, weight, teacher, rows, d2t, t2d, dtype)
    return loss, correct


class _HeadSoftCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, teacher, rows, d2t, t2d, dtype):
        w = weight.detach().to(dtype)
        dx = torch.empty(x.shape, dtype=dtype, device=x.device)
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=x.device)
        correct = torch.empty(x.shape[0], dtype=torch.bool, device=x.device)
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        for lo in range(0, x.shape[0], BLOCK):
            xb = x[lo : lo + BLOCK].detach().to(dtype)
            z = (xb @ w.T).float()
            wanted, target = teacher(rows[lo : lo + BLOCK])
            p = torch.softmax(target.float(), dim=-1)
            keep = t2d[wanted]
            lse = torch.logsumexp(z, dim=-1, keepdim=True)
            ce = (p * (lse - z)).sum(-1)
            total += torch.where(keep, ce, torch.zeros_like(ce)).sum()
            drafted = z.argmax(-1)
            correct[lo : lo + BLOCK] = drafted + d2t[drafted] == wanted
            dz = torch.exp_(z.sub_(lse)).mul_(p.sum(-1, keepdim=True)).sub_(p)
            dz = dz.mul_(keep[:, None]).to(dtype)
            dx[lo : lo + BLOCK] = dz @ w
            dw += (dz.T @ xb).float()
        ctx.save_for_backward(dx, dw)
        ctx.dtypes = (x.dtype, weight.dtype)
        ctx.mark_non_differentiable(correct)
        return total, correct

    @staticmethod
    def backward(ctx, grad_total, _grad_correct):
        dx, dw = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        return (
            (dx.float() * grad_total).to(x_dtype),
            (dw * grad_total).to(w_dtype),
            None,
            None,
            None,
            None,
            None,
        )
