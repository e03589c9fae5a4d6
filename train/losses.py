"""Per-position distillation and label losses; the trainer sums and normalises them.

Each function returns one value per position ([n]); `masked_sum` adds the supervised ones so
that the trainer can divide by the *global* count of supervised tokens (all micro-batches and
ranks of an optimizer step), never by a per-batch mean over padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DISTILL_LOSSES = ("fkl", "tvd", "lk", "jsd", "ce")


def forward_kl(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """KL(p_target || q_draft) per position."""
    log_q = F.log_softmax(draft_logits.float(), dim=-1)
    log_p = F.log_softmax(target_logits.float(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def total_variation(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """TVD(p, q) = 1/2 sum |p - q| per position; acceptance alpha = 1 - TVD."""
    q = F.softmax(draft_logits.float(), dim=-1)
    p = F.softmax(target_logits.float(), dim=-1)
    return 0.5 * (p - q).abs().sum(-1)


def negative_log_acceptance(
    draft_logits: torch.Tensor, target_logits: torch.Tensor
) -> torch.Tensor:
    """-log alpha, alpha = sum min(p, q) = 1 - TVD, per position (LK losses' LK^alpha, arXiv
    2602.23881: the acceptance rate itself; floored at 1e-6)."""
    q = F.softmax(draft_logits.float(), dim=-1)
    p = F.softmax(target_logits.float(), dim=-1)
    return -torch.minimum(p, q).sum(-1).clamp_min(1e-6).log()


def jensen_shannon(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """JSD(p, q) = 1/2 KL(p || m) + 1/2 KL(q || m), m = (p + q) / 2, per position."""
    log_q = F.log_softmax(draft_logits.float(), dim=-1)
    log_p = F.log_softmax(target_logits.float(), dim=-1)
    log_m = torch.logsumexp(torch.stack([log_p, log_q]), dim=0) - torch.log(torch.tensor(2.0))
    kl_p = (log_p.exp() * (log_p - log_m)).sum(-1)
    kl_q = (log_q.exp() * (log_q - log_m)).sum(-1)
    return 0.5 * (kl_p + kl_q)


def label_cross_entropy(draft_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy against the data's own tokens, per position."""
    return F.cross_entropy(draft_logits.float(), labels, reduction="none")


def distill_loss(
    kind: str,
    draft_logits: torch.Tensor,  # [n, vocab]
    target_logits: torch.Tensor | None,  # [n, vocab]; unused for "ce"
    labels: torch.Tensor,  # [n]
    temperature: float = 1.0,
) -> torch.Tensor:
    """Per-position loss of `kind` ("fkl", "tvd", "lk", "jsd" or "ce")."""
    if kind == "ce":
        return label_cross_entropy(draft_logits, labels)
    draft_logits, target_logits = draft_logits / temperature, target_logits / temperature
    if kind == "fkl":
        return forward_kl(draft_logits, target_logits)
    if kind == "tvd":
        return total_variation(draft_logits, target_logits)
    if kind == "lk":
        return negative_log_acceptance(draft_logits, target_logits)
    if kind == "jsd":
        return jensen_shannon(draft_logits, target_logits)
    raise ValueError(f"unknown loss {kind!r}; known: {', '.join(DISTILL_LOSSES)}")


def top1_agreement(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """1.0 where the draft's argmax equals the target's (greedy acceptance), per position."""
    return (draft_logits.argmax(-1) == target_logits.argmax(-1)).float()
