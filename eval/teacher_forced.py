"""Teacher-forced acceptance of an EAGLE drafter: per draft step, without speculative decoding.

    python bench/teacher_forced_bench.py --eagle1 DIR --eagle3 DIR --prompts 20
    draftzoo eval DIR --teacher-forced       # a `teacher_forced` entry in the eval report

On a sequence the target generated, the drafter unrolls `steps` draft steps at every position,
as chain drafting would if each of its drafts had been the sequence's next token (the
training-time-test unroll over the drafter's own outputs; the distributions are the chain's,
which the tests check). Step j at position t is scored by sum_x min(p(x), q(x)), p and q the
target's and the drafter's sampling distributions under the same `SamplingParams`: at T > 0
the probability that a token drafted from q passes the rejection test, at T = 0 (one-hot p and
q) whether the greedy draft is accepted.

Given that steps before j were accepted, the drafts are the sequence's tokens, so the mean
score of step j estimates the conditional acceptance rate a_j and tau ~ 1 + sum_j prod_{i<=j}
a_i. At T = 0 on the target's greedy output that condition is exact; at T > 0 it is an estimate
(accepted drafts follow min(p, q) renormalised, the sequence follows p). Every position of every
sequence counts, from one target forward per sequence, so drafters compare on far more
positions than decoding visits, and with no timing noise.

The first step is also split by whether its draft repeats an earlier bigram of the sequence
(`draftzoo.data.repeats`): a copy from the context, or fresh text.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from ..architectures.acceptance_length import simulated_acceptance_length
from ..architectures.eagle import EagleDrafter
from ..architectures.target import TargetAdapter
from ..data.repeats import repeated_bigrams
from ..inference.sampling import SamplingParams, probabilities


@dataclass(frozen=True)
class PositionBucket:
    """First-step acceptance of the drafts landing at sequence positions [start, end)."""

    start: int
    end: int | None  # None: no upper bound
    acceptance: float  # mean sum_x min(p, q) of step 0 (0.0 when nothing was scored)
    positions: int


@dataclass(frozen=True)
class DraftSubset:
    """First-step acceptance over a subset of the scored positions."""

    acceptance: float  # mean sum_x min(p, q) of step 0 (0.0 when nothing was scored)
    positions: int


@dataclass(frozen=True)
class TeacherForcedScores:
    """Mean scores over every scored position of every sequence."""

    acceptance: list[float]  # a_j per draft step: mean sum_x min(p, q)
    outside_mass: float  # first step: mean target probability of tokens it cannot propose
    positions: int  # positions scored per step
    #: a_j counting only the overlap on the `within` tokens given to `teacher_forced_scores`
    within: list[float] | None = None
    #: step 0 split by where its draft lands, when `position_edges` were given
    by_position: list[PositionBucket] | None = None
    #: step 0 on drafts repeating an earlier bigram of their sequence (a copy), and the rest
    repeated: DraftSubset | None = None
    fresh: DraftSubset | None = None

    @property
    def tau(self) -> float:
        """1 + sum_j prod_{i<=j} a_i: the acceptance length of a chain of len(acceptance)."""
        return simulated_acceptance_length(self.acceptance)


def proposable(drafter: EagleDrafter) -> torch.Tensor:
    """[vocab] bool: the target ids the drafter can propose (EAGLE-3: its draft vocabulary)."""
    return drafter.proposable_ids()


@torch.no_grad()
def unrolled_distributions(
    drafter: EagleDrafter,
    adapter: TargetAdapter,
    ids: torch.Tensor,  # [1, s] a token sequence
    params: SamplingParams,
    steps: int,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(p [s, vocab], [q_j [s, vocab] for j < steps]) under `params`: p[i] is the target's
    distribution of x_{i+1}; q_j[t] the drafter's for x_{t+2+j} at draft step j from position
    t, when the drafts of steps < j were x_{t+2}..x_{t+1+j}. Rows past the sequence are junk."""
    vocab = drafter.fields["vocab_size"]
    out = adapter(ids, hidden_indices=sorted({*drafter.layers, adapter.num_layers}))
    p = probabilities(out.logits[0], params)
    dtype = drafter.fc.weight.dtype
    states = torch.cat([out.hidden_states[layer].to(dtype) for layer in drafter.layers], dim=-1)
    s = ids.shape[1]
    allowed = torch.ones(s, s, dtype=torch.bool, device=ids.device).tril()[None, None]
    positions = torch.arange(s, device=ids.device)[None]
    outputs = drafter.ttt_unroll(ids, drafter.fuse(states), positions, allowed, steps)
    target_ids = drafter.to_target_ids(torch.arange(drafter.draft_vocab_size, device=ids.device))
    qs = []
    for hidden in outputs:
        q_draft = probabilities(drafter.logits(hidden[0]), params)
        q = torch.zeros(s, vocab, dtype=q_draft.dtype, device=q_draft.device)
        q[:, target_ids] = q_draft
        qs.append(q)
    return p, qs


def target_sequences(
    target, tokenizer, prompts: list[str], params: SamplingParams
) -> list[tuple[list[int], int]]:
    """(prompt + continuation ids, prompt length) per prompt, decoded target-only by the
    runtime under `params`; prompt i samples with seed `params.seed + i` (or i when unset)."""
    from dataclasses import replace

    from ..inference.generate import SpeculativeGenerator

    generator = SpeculativeGenerator(target, tokenizer)
    sequences = []
    for i, prompt in enumerate(prompts):
        prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        seeded = replace(params, seed=(params.seed or 0) + i)
        out = generator.generate(prompt_ids, seeded)
        sequences.append((prompt_ids + out.token_ids, len(prompt_ids)))
    return sequences


class _PositionBuckets:
    """Step-0 acceptance summed per sequence-position bucket [0, e_1), [e_1, e_2), ...,
    [e_last, end)."""

    def __init__(self, position_edges: Sequence[int], device) -> None:
        self.edges = [0, *position_edges]
        if any(b <= a for a, b in itertools.pairwise(self.edges)):
            raise ValueError(
                f"position_edges must increase from above 0, got {list(position_edges)}"
            )
        self.edges_tensor = torch.tensor(self.edges, device=device)
        self.sums = torch.zeros(len(self.edges), dtype=torch.float64, device=device)
        self.counts = torch.zeros(len(self.edges), dtype=torch.long, device=device)

    def add(self, positions: torch.Tensor, accepted: torch.Tensor) -> None:
        """Acceptance `accepted` [n] of drafts at sequence `positions` [n]."""
        bucket = torch.bucketize(positions, self.edges_tensor, right=True) - 1
        self.sums += torch.bincount(bucket, accepted.double(), minlength=len(self.edges))
        self.counts += torch.bincount(bucket, minlength=len(self.edges))

    def buckets(self) -> list[PositionBucket]:
        ends = [*self.edges[1:], None]
        totals = zip(self.edges, ends, self.sums.tolist(), self.counts.tolist(), strict=True)
        return [
            PositionBucket(start, end, float(total / n) if n else 0.0, int(n))
            for start, end, total, n in totals
        ]


def teacher_forced_scores(
    drafter: EagleDrafter,
    adapter: TargetAdapter,
    sequences: list[tuple[list[int], int]],  # (token ids, prompt length)
    params: SamplingParams,
    steps: int = 4,
    within: torch.Tensor | None = None,  # [vocab] bool: also score only these tokens' overlap
    position_edges: Sequence[int] = (),
) -> TeacherForcedScores:
    """Per-step acceptance over the generated part of each sequence: every position t from
    the last prompt token's predecessor on whose `steps` drafts all lie inside the sequence.
    With `within` (e.g. another drafter's vocabulary), the same pass also scores the overlap
    on those tokens only. With `position_edges` (increasing), step 0 is also split by the
    sequence position of its draft (t + 2 drafts x_{t+2}): [0, e_1), [e_1, e_2), ...,
    [e_last, end) — how a drafter trained on short rows holds up deeper into a context.
    Step 0 is always split by whether the sequence's token at the draft's position repeats an
    earlier bigram of the sequence (a draft landing past the end counts as fresh)."""
    device = drafter.fc.weight.device
    can_propose = proposable(drafter).to(device)
    keep = None if within is None else within.to(device)
    by_position = _PositionBuckets(position_edges, device)
    sums, sums_within, outside, count = [0.0] * steps, [0.0] * steps, 0.0, 0
    repeated_sum, repeated_count = 0.0, 0
    for tokens, prompt_length in sequences:
        if prompt_length < 2:
            raise ValueError("a scored sequence needs a prompt of at least two tokens")
        ids = torch.tensor([tokens], device=device)
        p, qs = unrolled_distributions(drafter, adapter, ids, params, steps)
        ts = torch.arange(prompt_length - 2, len(tokens) - steps, device=device)
        if not len(ts):
            continue
        repeats = repeated_bigrams(ids, torch.arange(len(tokens), device=device)[None])[0]
        past_end = torch.zeros(2, dtype=torch.bool, device=device)
        copied = torch.cat([repeats, past_end])[ts + 2]  # the token step 0 drafts repeats
        for j, q in enumerate(qs):
            overlap = torch.minimum(p[ts + 1 + j], q[ts])
            sums[j] += float(overlap.sum())
            if keep is not None:
                sums_within[j] += float(overlap[:, keep].sum())
            if j == 0:
                repeated_sum += float(overlap[copied].sum())
                repeated_count += int(copied.sum())
            if j == 0 and position_edges:
                by_position.add(ts + 2, overlap.sum(-1))
        outside += float(p[ts + 1][:, ~can_propose].sum())
        count += len(ts)
    if not count:
        raise ValueError(f"no sequence is long enough to score {steps} draft steps")
    fresh_count = count - repeated_count
    return TeacherForcedScores(
        [total / count for total in sums],
        outside / count,
        count,
        None if keep is None else [total / count for total in sums_within],
        by_position.buckets() if position_edges else None,
        DraftSubset(repeated_sum / repeated_count if repeated_count else 0.0, repeated_count),
        DraftSubset((sums[0] - repeated_sum) / fresh_count if fresh_count else 0.0, fresh_count),
    )


def teacher_forced_results(
    target,
    tokenizer,
    drafter: EagleDrafter,
    prompts: list[str],
    temperatures: tuple[float, ...],
    max_new_tokens: int,
    steps: int,
    seed: int = 0,
    position_edges: Sequence[int] = (),
) -> list[dict]:
    """One report entry per temperature: the target decodes `prompts` (prompt i with seed
    `seed + i`), and the drafter's `steps`-step chain is scored at every position; with
    `position_edges`, the first step is also split by where its draft lands."""
    adapter = TargetAdapter(target, tokenizer)
    results = []
    for temperature in temperatures:
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
        sequences = target_sequences(target, tokenizer, prompts, params)
        scores = teacher_forced_scores(
            drafter, adapter, sequences, params, steps, position_edges=position_edges
        )
        entry = {
            "temperature": temperature,
            "steps": steps,
            "tau": scores.tau,
            "acceptance_per_step": scores.acceptance,
            "outside_mass": scores.outside_mass,
            "positions": scores.positions,
            "first_step_repeated": asdict(scores.repeated),
            "first_step_fresh": asdict(scores.fresh),
        }
        if scores.by_position is not None:
            entry["first_step_by_position"] = [asdict(b) for b in scores.by_position]
        results.append(entry)
    return results
