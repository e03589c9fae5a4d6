"""EAGLE training losses over one batch, as sums (the recipe divides by the global count).

Index conventions: drafter position t reads (x_{t+1}, the target's state at t) and predicts
x_{t+2}, whose target distribution is the target's at position t+1. Position t counts when
x_{t+2} is supervised and in the same packed sample.

EAGLE-1: SmoothL1(h_t, f_{t+1}) + 0.1 x soft CE(lm_head(h_t), p_{t+1}).
EAGLE-3 with training-time test: step j (0..k-1) reads x_{t+1+j} and the layer's own output of
step j-1 at t, sees step-0 keys causally and its own position's keys of steps 1..j, and is
scored by weight^j x soft CE over the draft vocabulary against p_{t+1+j} renormalised over it;
positions whose target argmax lies outside the draft vocabulary carry no loss (their
accuracy counts as a miss). Opt-in (`eagle.feature_weight` w): + w x weight^j x SmoothL1 between
step j's output at t and the fused target state g_{t+1+j} (what step 0 reads where step j + 1
reads x_{t+2+j}), both RMS-normalised and the latter detached. Opt-in
(`eagle.final_feature_weight` v): + v x weight^j x SmoothL1 between norm(step j's output at t),
`norm` the target's frozen final norm, and the target's final post-norm state f_{t+1+j}, whose
logits are step j's target: EAGLE-1's feature target, where the target's head reads it (the
draft norm and head start as the target's).

Opt-in for both families (`eagle.token_loss: tvd`): the soft CE is replaced by the rejection
probability 1 - alpha, alpha = sum_x min(p(x), q(x)), x over the drafter's vocabulary and p the
target's whole distribution (never renormalised: mass outside the draft vocabulary can never be
accepted), which is exactly what a token drafted at T = 1 loses; EAGLE-3 then scores every real
position. `eagle.token_loss: lk` scores -log alpha instead (LK losses' LK^alpha, arXiv
2602.23881: the acceptance rate itself, its gradient TV's scaled by 1 / alpha, so a drafter far
from the target is not left with TV's vanishing gradients).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from ..architectures.eagle import shift
from ..data.batching import Batch
from .chunked_loss import rowwise
from .fused_head_loss import head_soft_ce
from .teacher_reads import read_positions, read_teacher, read_teacher_once

Stats = dict[str, torch.Tensor]  # name -> [sum, count]


def attention_allowed(batch: Batch) -> torch.Tensor:
    """[b, 1, s, s] bool: causal within each sample; padded queries see only themselves."""
    if batch.packed:
        allowed = batch.attention_mask == 0
    else:
        s = batch.input_ids.shape[1]
        causal = torch.tril(torch.ones(s, s, dtype=torch.bool, device=batch.input_ids.device))
        allowed = causal[None, None] & batch.attention_mask.bool()[:, None, None, :]
    eye = torch.eye(allowed.shape[-1], dtype=torch.bool, device=allowed.device)
    return allowed | eye


def ahead(t: torch.Tensor, by: int, keep: torch.Tensor) -> torch.Tensor:
    """`shift(t, by)[keep]` without copying t: rows of t at positions t + by where `keep`
    (whose last `by` columns must be False) is set."""
    width = t.shape[1]
    if keep[:, width - by :].any():
        raise ValueError("keep selects positions past the end of the sequence")
    return t[:, by:][keep[:, : width - by]]


def real_positions(batch: Batch, distance: int) -> torch.Tensor:
    """[b, s] bool: x_{t+distance} is supervised and in position t's sample."""
    pos = batch.position_ids
    same = shift(pos, distance, fill=-1) == pos + distance
    return same & shift(batch.loss_mask.bool(), distance, fill=False)


def noisy(features: torch.Tensor, amplitude: float, training: bool) -> torch.Tensor:
    """Features plus uniform noise in [-amplitude, amplitude] (training only)."""
    if amplitude <= 0 or not training:
        return features
    return features + (torch.rand_like(features) * 2 - 1) * amplitude


def soft_ce(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of `logits` [n, v] against probabilities [n, v], per row."""
    return -(target_probs * F.log_softmax(logits.float(), dim=-1)).sum(-1)


def rejection(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """1 - sum_x min(p(x), q(x)) per row, q = softmax(`logits`) [n, v] and p `target_probs`
    [n, v] (p may sum to less than 1: the target's mass on tokens the drafter cannot propose)."""
    q = F.softmax(logits.float(), dim=-1)
    return 1 - torch.minimum(q, target_probs).sum(-1)


#: alpha below this counts as this (-log alpha stays finite where no draft token can be accepted)
MIN_ACCEPTANCE = 1e-6


def neg_log_acceptance(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """-log sum_x min(p(x), q(x)) per row (`rejection`'s alpha, floored at `MIN_ACCEPTANCE`)."""
    q = F.softmax(logits.float(), dim=-1)
    return -torch.minimum(q, target_probs).sum(-1).clamp_min(MIN_ACCEPTANCE).log()


#: token losses against the target's whole distribution, by name
ACCEPTANCE_LOSS = {"tvd": rejection, "lk": neg_log_acceptance}


def split_by_repeats(correct: torch.Tensor, repeated: torch.Tensor | None) -> Stats:
    """First-step hits [sum, count] on drafted tokens that repeat an earlier bigram of their
    sample (`acc_0_repeated`: a copy from context) and on the rest (`acc_0_fresh`); `correct`
    and `repeated` are [n] bool over the same positions. Empty when `repeated` is None."""
    if repeated is None:
        return {}
    stats: Stats = {}
    for name, where in (("acc_0_repeated", repeated), ("acc_0_fresh", ~repeated)):
        stats[name] = torch.stack([correct[where].sum(), where.sum()]).float()
    return stats


def eagle1_loss_sums(
    outputs: list[torch.Tensor],  # the drafter's forward, one step: [n, h]
    keep: torch.Tensor,  # [b, s] bool: the positions `outputs` holds
    final: torch.Tensor,  # [b, s, h] target final post-norm states
    head: Callable[[torch.Tensor], torch.Tensor],  # the drafter's states -> logits
    teacher_head: Callable[[torch.Tensor], torch.Tensor],  # final states -> target logits
    token_loss: str = "ce",
    repeated: torch.Tensor | None = None,  # [n] bool at `keep`: x_{t+2} repeats a bigram
    chunk: int | None = None,  # rows projected to the vocabulary at once
) -> tuple[torch.Tensor, Stats]:
    """Summed EAGLE-1 loss: SmoothL1 to the next feature + 0.1 x soft CE (or, with
    `token_loss="tvd"`, the rejection probability); stats (with `repeated`, the top-1
    accuracy split by `split_by_repeats`)."""
    (hidden,) = outputs
    want_feature = ahead(final, 1, keep)
    feature = F.smooth_l1_loss(hidden.float(), want_feature.float(), reduction="none").mean(-1)

    def token_rows(h: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = head(h)
        with torch.no_grad():
            probs = torch.softmax(teacher_head(f).float(), dim=-1)
            correct = logits.argmax(-1) == probs.argmax(-1)
        tokens = ACCEPTANCE_LOSS.get(token_loss, soft_ce)(logits, probs)
        return tokens, correct

    tokens, correct = rowwise(token_rows, (hidden, want_feature), chunk)
    loss = feature.sum() + 0.1 * tokens.sum()
    count = keep.sum().to(loss.dtype)
    stats = {
        "feature_loss": torch.stack([feature.detach().sum(), count]),
        "acc_0": torch.stack([correct.sum().to(loss.dtype), count]),
        **split_by_repeats(correct, repeated),
    }
    return loss, stats


def feature_alignment(hidden: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
    """Per row: SmoothL1 between RMS-normalised `hidden` and RMS-normalised `wanted`."""
    return F.smooth_l1_loss(
        F.rms_norm(hidden.float(), hidden.shape[-1:]),
        F.rms_norm(wanted.float(), wanted.shape[-1:]),
        reduction="none",
    ).mean(-1)


def _token_loss(logits, wanted, target, log_norm, t2d, token_loss: str) -> torch.Tensor:
    """One step's token loss per position: the soft CE against the target's distribution over
    the draft vocabulary (0 where the target's argmax `wanted` is outside it), or with
    `token_loss="tvd"` the rejection probability (`target`: the target's logits on the draft
    vocabulary, `log_norm` their log-normaliser over the whole vocabulary)."""
    if token_loss in ACCEPTANCE_LOSS:
        return ACCEPTANCE_LOSS[token_loss](logits, torch.exp(target - log_norm[:, None]))
    ce = soft_ce(logits, torch.softmax(target, dim=-1))
    return torch.where(t2d[wanted], ce, torch.zeros_like(ce))


def _draft_token_rows(head, d2t, t2d, token_loss: str, hidden, wanted, target, log_norm):
    """(token loss, top-1 hit) per position of one EAGLE-3 step, from its states and the
    target's reads one position ahead (`rowwise`'s row function)."""
    logits = head(hidden)
    with torch.no_grad():
        draft_ids = logits.argmax(-1)
        correct = draft_ids + d2t[draft_ids] == wanted
    return _token_loss(logits, wanted, target, log_norm, t2d, token_loss), correct


def _final_regression(hidden, wanted_state, head_norm) -> torch.Tensor:
    """Per position SmoothL1(head_norm(h_j), f_{t+1+j}), averaged over the hidden size."""
    return F.smooth_l1_loss(head_norm(hidden).float(), wanted_state.float(), reduction="none").mean(
        -1
    )


def _step_token_rows(
    head, teacher_head, d2t, t2d, token_loss: str, final, chunk, draft_head, select
):
    """`(j, hidden, real) -> (token loss, top-1 hit)` of TTT step j: per position, or with
    `draft_head` (its norm and weight) and the soft CE, summed by `head_soft_ce`, a block of
    rows at a time. The target is read once for every step, at the positions the steps read
    (`select`), where that costs no more memory than a chunk (`teacher_reads`), else a chunk's
    or block's rows at a time."""
    token_rows = partial(_draft_token_rows, head, d2t, t2d, token_loss)
    tvd = token_loss in ACCEPTANCE_LOSS  # the whole distribution's normaliser is read too
    read = read_positions(select)
    once = read_teacher_once(teacher_head, final, t2d, tvd, chunk, t2d.numel(), read)
    flat_final = final.flatten(0, 1)
    positions = torch.arange(flat_final.shape[0], device=final.device).view(final.shape[:2])
    # rows are gathered where they are used: a [rows, vocab] copy of every row at once costs
    # more than the reads themselves
    if once is None:

        def teacher(rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return read_teacher(teacher_head, flat_final[rows], t2d, tvd)

    else:
        flat = [read.flatten(0, 1) for read in once]

        def teacher(rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(read[rows] for read in flat)

    def read_rows(hidden: torch.Tensor, rows: torch.Tensor):
        return token_rows(hidden, *teacher(rows))

    def step(j: int, hidden: torch.Tensor, real: torch.Tensor):
        rows = ahead(positions, 1 + j, real)
        if draft_head is None or tvd:
            return rowwise(read_rows, (hidden, rows), chunk)
        norm, weight = draft_head
        return head_soft_ce(norm(hidden), weight, lambda r: teacher(r)[:2], rows, d2t, t2d)

    return step


def eagle3_loss_sums(
    outputs: list[torch.Tensor],  # the drafter's forward, per TTT step: [n_j, h]
    select: list[torch.Tensor],  # per step, [b, s] bool: the positions of outputs[j]
    final: torch.Tensor,  # [b, s, h] target final post-norm states
    head: Callable[[torch.Tensor], torch.Tensor],  # the drafter's states -> draft logits
    teacher_head: Callable[[torch.Tensor], torch.Tensor],  # final states -> target logits
    d2t: torch.Tensor,  # [draft vocab] target id offsets
    t2d: torch.Tensor,  # [V] bool: target ids in the draft vocabulary
    decay: float,
    fused: torch.Tensor | None = None,  # [b, s, h] step 0's fused states, for the aux loss
    feature_weight: float = 0.0,
    token_loss: str = "ce",
    repeated: torch.Tensor | None = None,  # [n_0] bool at select[0]: x_{t+2} repeats a bigram
    head_norm: torch.nn.Module | None = None,  # the target's final norm, for the aux loss
    final_feature_weight: float = 0.0,
    chunk: int | None = None,  # rows projected to the vocabulary at once
    draft_head: tuple[torch.nn.Module, torch.Tensor] | None = None,  # `head`'s norm, weight
) -> tuple[torch.Tensor, Stats]:
    """Summed sum_j decay^j x (the soft CE over the draft vocabulary — with
    `token_loss="tvd"`, the rejection probability instead — + `feature_weight` x the feature
    alignment to `fused`, detached, + `final_feature_weight` x SmoothL1(head_norm(h_j),
    f_{t+1+j})); per-step top-1 accuracy (with `repeated`, step 0's split by
    `split_by_repeats`)."""
    if feature_weight and fused is None:
        raise ValueError("feature_weight needs the fused states")
    if final_feature_weight and head_norm is None:
        raise ValueError("final_feature_weight needs the target's final norm")

    step_tokens = _step_token_rows(
        head, teacher_head, d2t, t2d, token_loss, final, chunk, draft_head, select
    )
    loss = torch.zeros((), device=final.device)
    stats: Stats = {}
    aligned = torch.zeros((), device=final.device)
    regressed = torch.zeros((), device=final.device)
    for j, (hidden, real) in enumerate(zip(outputs, select, strict=True)):
        tokens, correct = step_tokens(j, hidden, real)
        loss = loss + (decay**j) * tokens.sum()
        if feature_weight:
            alignment = feature_alignment(hidden, ahead(fused, 1 + j, real).detach()).sum()
            loss = loss + feature_weight * (decay**j) * alignment
            aligned = aligned + alignment.detach()
        if final_feature_weight:
            regression = _final_regression(hidden, ahead(final, 1 + j, real), head_norm)
            loss = loss + final_feature_weight * (decay**j) * regression.sum()
            regressed = regressed + regression.detach().sum()
        with torch.no_grad():
            hits = correct.sum().to(loss.dtype)
            stats[f"acc_{j}"] = torch.stack([hits, real.sum().to(loss.dtype)])
            if j == 0:
                stats.update(split_by_repeats(correct, repeated))
    positions = torch.stack([real.sum() for real in select]).sum()
    if feature_weight:
        stats["feature_loss"] = torch.stack([aligned, positions.to(aligned)])
    if final_feature_weight:
        stats["final_feature_loss"] = torch.stack([regressed, positions.to(regressed)])
    return loss, stats
