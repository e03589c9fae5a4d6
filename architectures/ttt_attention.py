"""Training-time-test attention on the CPU's flash kernel, exact, without [s, s] scores.

Step j of EAGLE-3's training-time test attends, at position t, to the step-0 keys its
position sees (`mask0`) and to its own position's keys of steps 1..j. That is one softmax over
both groups; it splits exactly: the flash kernel attends over the step-0 keys and returns its
log-normaliser lse0, and the diagonal scores d_i join it through logZ = logsumexp(lse0, d_1..d_j):

    out = exp(lse0 - logZ) * out0 + sum_i exp(d_i - logZ) * v_i

The backward is the same split: the flash kernel's own backward for the step-0 keys, given
the gradient scaled by exp(lse0 - logZ) and the merged output (so that its row term
dout . out is the merged one), plus the diagonal terms in closed form. Scores and softmax
weights are never held as [b, H, s, s] tensors, which cost EAGLE-3 most of a training step at
1,024 tokens a row (bench/eagle3_step_profile.py).
"""

from __future__ import annotations

import torch

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def flash_ttt_attention(
    q: torch.Tensor,  # [b, H, s, d] step j's queries (CPU)
    keys: list[torch.Tensor],  # [b, H, s, d] per step 0..j
    values: list[torch.Tensor],
    mask0: torch.Tensor,  # [b, 1, s, s] bool: which step-0 keys each position sees
) -> torch.Tensor:
    """`eagle.ttt_attention`'s values and gradients through the CPU flash kernel, computed in
    the autocast dtype where autocast is on (as the matmuls of the eager form run), else in
    the queries' dtype, and returned in the queries' dtype, as the eager form returns them."""
    device, out_dtype = q.device.type, q.dtype
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else q.dtype
    q, keys, values = q.to(dtype), [k.to(dtype) for k in keys], [v.to(dtype) for v in values]
    bias = torch.zeros(mask0.shape, dtype=dtype, device=q.device)
    bias.masked_fill_(~mask0, float("-inf"))
    return _TttAttention.apply(bias, q, len(keys), *keys, *values).to(out_dtype)


class _TttAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, bias, q, steps, *kv):
        keys, values = kv[:steps], kv[steps:]
        scale = q.shape[-1] ** -0.5
        out0, lse0 = _flash(q, keys[0], values[0], 0.0, False, attn_mask=bias, scale=scale)
        qf = q.float()
        diagonal = [(qf * k.float()).sum(-1) * scale for k in keys[1:]]  # [b, H, s] each
        log_z = torch.logsumexp(torch.stack([lse0, *diagonal]), dim=0)
        weight0 = torch.exp(lse0 - log_z)
        weights = [torch.exp(d - log_z) for d in diagonal]
        out = weight0[..., None] * out0.float()
        for w, v in zip(weights, values[1:], strict=True):
            out = out + w[..., None] * v.float()
        out = out.to(q.dtype)
        ctx.save_for_backward(bias, q, lse0, weight0, out, *weights, *kv)
        ctx.steps, ctx.scale = steps, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        bias, q, lse0, weight0, out, *rest = ctx.saved_tensors
        steps, scale = ctx.steps, ctx.scale
        weights, kv = rest[: steps - 1], rest[steps - 1 :]
        keys, values = kv[:steps], kv[steps:]
        dout = grad_out.float()
        row = (dout * out.float()).sum(-1)  # dout . out, the merged output's row term
        scaled = (weight0[..., None] * dout).to(q.dtype)
        dq, dk0, dv0 = _flash_backward(
            scaled, q, keys[0], values[0], out, lse0, 0.0, False, attn_mask=bias, scale=scale
        )
        dq = dq.float()
        qf = q.float()
        dkeys, dvalues = [dk0], [dv0]
        for w, k, v in zip(weights, keys[1:], values[1:], strict=True):
            ds = w * ((dout * v.float()).sum(-1) - row) * scale  # [b, H, s]
            dq = dq + ds[..., None] * k.float()
            dkeys.append((ds[..., None] * qf).to(k.dtype))
            dvalues.append((w[..., None] * dout).to(v.dtype))
        return None, dq.to(q.dtype), None, *dkeys, *dvalues
