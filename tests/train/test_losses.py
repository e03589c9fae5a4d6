"""Distillation losses against naive per-position references."""

from __future__ import annotations

import math

import pytest
import torch

from draftzoo.train.losses import distill_loss, top1_agreement


@pytest.fixture
def logits():
    torch.manual_seed(0)
    return torch.randn(5, 11) * 2, torch.randn(5, 11) * 2


def naive(kind, q_logits, p_logits):
    rows = []
    for q_row, p_row in zip(
        q_logits.softmax(-1).tolist(), p_logits.softmax(-1).tolist(), strict=True
    ):
        if kind == "fkl":
            rows.append(sum(p * math.log(p / q) for p, q in zip(p_row, q_row, strict=True)))
        elif kind == "tvd":
            rows.append(0.5 * sum(abs(p - q) for p, q in zip(p_row, q_row, strict=True)))
        else:
            m = [(p + q) / 2 for p, q in zip(p_row, q_row, strict=True)]
            kl_p = sum(p * math.log(p / mm) for p, mm in zip(p_row, m, strict=True))
            kl_q = sum(q * math.log(q / mm) for q, mm in zip(q_row, m, strict=True))
            rows.append(0.5 * kl_p + 0.5 * kl_q)
    return torch.tensor(rows)


@pytest.mark.parametrize("kind", ["fkl", "tvd", "jsd"])
def test_distillation_losses_match_naive_formulas(kind, logits):
    draft, target = logits
    got = distill_loss(kind, draft, target, torch.zeros(5, dtype=torch.long))
    torch.testing.assert_close(got, naive(kind, draft, target), atol=1e-5, rtol=1e-5)
    same = distill_loss(kind, target, target, torch.zeros(5, dtype=torch.long))
    assert same.abs().max() < 1e-5


def test_jsd_is_symmetric_and_bounded_and_tvd_gives_acceptance(logits):
    draft, target = logits
    labels = torch.zeros(5, dtype=torch.long)
    a = distill_loss("jsd", draft, target, labels)
    torch.testing.assert_close(a, distill_loss("jsd", target, draft, labels))
    assert (a <= math.log(2) + 1e-6).all()
    # alpha = sum min(p, q) = 1 - TVD: the sampling acceptance rate the runtime measures
    p, q = target.softmax(-1), draft.softmax(-1)
    alpha = torch.minimum(p, q).sum(-1)
    torch.testing.assert_close(1 - distill_loss("tvd", draft, target, labels), alpha)
    # LK^alpha: the acceptance rate itself, -log alpha (its gradient TV's over alpha)
    torch.testing.assert_close(distill_loss("lk", draft, target, labels), -alpha.log())
    draft = draft.clone().requires_grad_()
    distill_loss("lk", draft, target, labels).sum().backward()
    lk_grad = draft.grad.clone()
    draft.grad = None
    tv = distill_loss("tvd", draft, target, labels)
    (tv / alpha).sum().backward()  # d(-log alpha) = d(1 - alpha) / alpha
    torch.testing.assert_close(lk_grad, draft.grad)


def test_label_loss_and_temperature_and_agreement(logits):
    draft, target = logits
    labels = torch.tensor([0, 3, 5, 7, 10])
    ce = distill_loss("ce", draft, None, labels)
    torch.testing.assert_close(ce, -draft.log_softmax(-1)[torch.arange(5), labels])
    hot = distill_loss("fkl", draft, target, labels, temperature=2.0)
    torch.testing.assert_close(hot, naive("fkl", draft / 2, target / 2), atol=1e-5, rtol=1e-5)
    assert top1_agreement(target, target).sum() == 5
    with pytest.raises(ValueError, match="unknown loss"):
        distill_loss("rkl", draft, target, labels)
