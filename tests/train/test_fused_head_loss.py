"""EAGLE-3's soft cross-entropy fused with its gradient (`head_soft_ce`) against autograd's:
the same summed loss, hits and gradients, with the target read once or a block at a time, rows
whose target argmax lies outside the draft vocabulary carrying no loss, under float32 and under
bfloat16 autocast (there to its rounding: far closer than bfloat16 is to float32)."""

from __future__ import annotations

import pytest
import torch

from draftzoo.train import fused_head_loss
from draftzoo.train.eagle_losses import eagle3_loss_sums


def _loss(draft_head, chunk, autocast: bool):
    torch.manual_seed(0)
    vocab, draft, steps, s, h = 300, 64, 3, 40, 16
    t2d = torch.zeros(vocab, dtype=torch.bool)
    kept = torch.randperm(vocab)[:draft].sort().values
    t2d[kept] = True
    d2t = kept - torch.arange(draft)
    select = [torch.arange(s)[None].expand(2, s) + 2 + j < s for j in range(steps)]
    teacher = torch.nn.Linear(h, vocab).requires_grad_(False)
    final = torch.randn(2, s, h)
    norm = torch.nn.RMSNorm(h)
    head = torch.nn.Linear(h, draft, bias=False)
    torch.manual_seed(1)
    outputs = [torch.randn(int(k.sum()), h, requires_grad=True) for k in select]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss, stats = eagle3_loss_sums(
            outputs,
            select,
            final,
            lambda x: head(norm(x)),
            teacher,
            d2t,
            t2d,
            0.8,
            chunk=chunk,
            draft_head=(norm, head.weight) if draft_head else None,
        )
    loss.backward()
    grads = [o.grad for o in outputs] + [head.weight.grad, norm.weight.grad]
    return loss.detach(), stats, grads, t2d[teacher(final).argmax(-1)]


@pytest.mark.parametrize("chunk", [None, 7])  # read once; each block's rows read on their own
def test_fused_equals_autograd_in_float32(chunk, monkeypatch):
    monkeypatch.setattr(fused_head_loss, "BLOCK", 5)  # several blocks, a partial last one
    loss, stats, grads, kept = _loss(True, chunk, False)
    want_loss, want_stats, want_grads, _ = _loss(False, chunk, False)
    assert not kept.all() and kept.any()  # some rows carry no loss
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5)
    assert {k: v.tolist() for k, v in stats.items()} == {
        k: v.tolist() for k, v in want_stats.items()
    }
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_fused_equals_autograd_under_bfloat16_autocast():
    loss, stats, grads, _ = _loss(True, None, True)
    want_loss, want_stats, want_grads, _ = _loss(False, None, True)
    _, _, exact_grads, _ = _loss(False, None, False)
    torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=1e-4)
    assert stats["acc_0"].tolist() == want_stats["acc_0"].tolist()
    for got, want, exact in zip(grads, want_grads, exact_grads, strict=True):
        scale = exact.abs().max()
        assert (got - want).abs().max() < 0.25 * (want - exact).abs().max() + 1e-3 * scale
