"""Hybrid proposals: a trained drafter's chain or tree beside the model-free proposals, each
round verifying whichever is measured to commit the most tokens per second.

Every round two model-free candidates are found first (cheap: no model): prompt lookup's copy of
what followed the last match of the context's final n-gram, and suffix decoding's branches from
the counts of the request and of earlier outputs. The rule (`hybrid_rule.choose`) then picks:

- **a candidate alone** (`lookup` / `suffix`): the drafter's forward is skipped (its pending
  target states wait for the next round it drafts);
- **both**: the drafter's chain or tree with the candidate merged in: a node whose parent
  already has a child of the same token follows that child, the others are appended after
  the drafter's own children;
- **the drafter alone** (its proposal untouched, on the device where it drafted);
- **nothing** (`none`: a plain decoding step, one target forward for one token).

By pace (the default) it takes the highest expected committed tokens per second: 1 + the
expected accepted nodes over the round's measured seconds for its kind and width. Candidates'
yields are measured every round, whatever was verified (a candidate that did poorly is
re-measured for free: `hybrid_rule`); the drafter, and a plain step, are probed when not chosen
for `probe_every` rounds. Without pace (`pace=False`: no clock, so the choices reproduce on
any machine) a candidate goes alone from `alone_margin` x the drafter's yield, is merged from
`min_score`, and the drafter drafts otherwise. Everything is kept per sampling temperature
(a sampled target accepts less) and across requests. Timing makes the choices, not the output,
depend on the machine: greedy output is the target's whatever is proposed, and sampled output
is the target's distribution (a fixed seed no longer fixes the sample).

Lossless: model-free nodes are deterministic (q one-hot) and come after the drafter's siblings,
so recursive rejection at every node tests each child against the distribution it was drawn
from (acceptance.py); greedy rounds follow the target's argmax down the merged tree.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import torch

from ..proposer import Proposer
from ..sampling import SamplingParams
from ..tree import Proposal
from .hybrid_rule import (
    CLIP_SECONDS,
    DRAFTED,
    MAX_BUCKET,
    Calibration,
    Candidate,
    Choice,
    HybridSettings,
    Mean,
    accepted_nodes,
    choose,
)
from .prompt_lookup import lookup_match
from .suffix import SuffixCache, SuffixProposer

__all__ = ["HybridProposer", "HybridSettings", "accepted_nodes", "merge"]


@dataclass
class _Round:
    """What a round proposed, to measure it once the tokens after it are committed."""

    context_length: int
    calibration: Calibration
    choice: Choice
    proposal: Proposal
    from_drafter: list[bool] | None  # per node; None: every node is the drafter's
    candidates: list[Candidate]
    drafted: Proposal | None  # the drafter's own proposal, when it drafted
    started: float
    depth: int = 0  # committed tokens needed after the round to walk every candidate
    #: False for a request's first round: the drafter reads the whole prompt's states there,
    #: which every proposal pays once, not a round's cost
    timed: bool = True


def merge(proposal: Proposal, found: Candidate) -> tuple[Proposal, list[bool]]:
    """The drafter's `proposal` with the candidate `found` merged in (appended after the
    drafter's nodes, one-hot q where the drafter's nodes carry theirs); which nodes are the
    drafter's."""
    tokens, parents = list(proposal.tokens), list(proposal.parents)
    from_drafter = [True] * len(tokens)
    children: dict[tuple[int, int], int] = {}
    for index, (token, parent) in enumerate(zip(tokens, parents, strict=True)):
        children.setdefault((parent, token), index)
    placed: list[int] = []  # candidate node -> merged index
    for token, parent in zip(found.tree.tokens, found.tree.parents, strict=True):
        at = placed[parent] if parent >= 0 else -1
        index = children.get((at, token))
        if index is None:
            index = len(tokens)
            tokens.append(token)
            parents.append(at)
            from_drafter.append(False)
            children[(at, token)] = index
        placed.append(index)
    probs = proposal.draft_probs
    if probs is not None:
        added = len(tokens) - len(proposal)
        one_hot = probs.new_zeros(added, probs.shape[-1])
        one_hot[torch.arange(added), torch.tensor(tokens[len(proposal) :], dtype=torch.long)] = 1
        probs = torch.cat([probs, one_hot])
    return Proposal(tokens, parents, probs), from_drafter


class HybridProposer(Proposer):
    """A drafter that drafts trees (or chains), with model-free candidates beside it."""

    def __init__(
        self,
        drafter: Proposer,
        settings: HybridSettings | None = None,
        cache: SuffixCache | None = None,
    ) -> None:
        self.drafter = drafter
        self.settings = settings or HybridSettings()
        self.suffix = SuffixProposer(self.settings.suffix, cache)
        self.target_layers = drafter.target_layers
        self.choices: Counter[str] = Counter()  # rounds by the rule's choice (all requests)
        #: {sampling temperature: what each kind of round delivered there}, kept across requests
        self.calibrations: dict[float, Calibration] = {}
        self.reset()

    def reset(self) -> None:
        """A new request for both proposers (the measured calibrations are kept)."""
        self.drafter.reset()
        self.suffix.reset()
        self._pending: list[_Round] = []  # rounds whose candidates are not walked yet
        self._first = True  # the request's first round is still to come
        self._last: _Round | None = None

    def observe(self, states: torch.Tensor) -> None:
        self.drafter.observe(states)

    def cache_nbytes(self) -> int:
        return self.drafter.cache_nbytes()

    def finish(self, token_ids: list[int]) -> None:
        self.drafter.finish(token_ids)
        self.suffix.finish(token_ids)

    def candidates(self, context: list[int], max_tokens: int) -> list[Candidate]:
        """This round's model-free candidates (the suffix structures count `context`)."""
        found = []
        if self.settings.lookup:
            n, follow = lookup_match(context, max_tokens)
            if follow:
                found.append(Candidate("lookup", Proposal.chain(follow), min(n, MAX_BUCKET)))
        speculation = self.suffix.speculation(context, max_tokens)
        if speculation is not None:
            bucket = min(int(2 * speculation.score), MAX_BUCKET)
            tree = Proposal(speculation.tokens, speculation.parents)
            found.append(Candidate("suffix", tree, bucket, speculation.score))
        return found

    def _measure(self, context: list[int], now: float) -> None:
        """The last round's time and what the drafter delivered in it; every earlier round's
        candidates walked along the tokens committed after it, once they are all known."""
        decay = self.settings.decay
        last, self._last = self._last, None
        if last is not None:
            calibration, choice = last.calibration, last.choice.kind
            drafted = choice in DRAFTED
            if last.timed:
                key = (drafted, 0 if choice == "none" else len(last.proposal))
                seconds = calibration.seconds.setdefault(key, Mean())
                seconds.add(now - last.started, decay, CLIP_SECONDS)
            if drafted:
                committed = context[last.context_length :][:-1]  # the last: the target's
                if last.from_drafter is None:  # every node the drafter's: no walk (host read)
                    mine = len(committed)
                else:
                    path = accepted_nodes(last.proposal, committed)
                    mine = sum(1 for node in path if last.from_drafter[node])
                calibration.drafter.add(mine, self.settings.drafter_decay)
            if last.candidates:
                if last.drafted is not None:  # read now, before the drafter's buffers move on
                    last.drafted = Proposal(list(last.drafted.tokens), last.drafted.parents)
                trees = [c.tree for c in last.candidates] + [last.drafted]
                last.depth = max(max(t.depths, default=0) for t in trees if t is not None)
                self._pending.append(last)
        waiting = []
        for round_ in self._pending:
            future = context[round_.context_length :]
            if len(future) < round_.depth:
                waiting.append(round_)
            else:
                self._walk(round_, future)
        self._pending = waiting

    def _walk(self, round_: _Round, future: list[int]) -> None:
        """What each candidate would have had accepted, and merged into the drafter's."""
        calibration, decay = round_.calibration, self.settings.decay
        mine = None
        if round_.drafted is not None:
            mine = len(accepted_nodes(round_.drafted, future))
        for candidate in round_.candidates:
            walked = len(accepted_nodes(candidate.tree, future))
            calibration.yields.setdefault(candidate.key, Mean()).add(walked, decay)
            if mine is not None:
                gain = max(walked, mine) - mine
                calibration.gains.setdefault(candidate.key, Mean()).add(
                    gain, self.settings.drafter_decay
                )

    @torch.no_grad()
    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Proposal:
        now = time.perf_counter()
        self._measure(context, now)
        self.suffix.update(context)
        if max_tokens <= 0:
            return Proposal.chain([])
        candidates = self.candidates(context, max_tokens)
        calibration = self.calibrations.setdefault(params.temperature, Calibration())
        calibration.rounds += 1
        choice = choose(calibration, candidates, self.settings)
        calibration.drafted = choice.kind in DRAFTED
        self.choices[choice.kind] += 1
        drafted = from_drafter = None
        if choice.kind in DRAFTED:
            calibration.last["drafter"] = calibration.rounds
            drafted = proposal = self.drafter.propose(context, max_tokens, params, generator)
            calibration.drafter_width = len(proposal)
            if choice.kind == "both":
                assert choice.candidate is not None
                proposal, from_drafter = merge(proposal, choice.candidate)
        elif choice.kind == "none":
            calibration.last["none"] = calibration.rounds
            proposal = Proposal.chain([])
        else:
            assert choice.candidate is not None
            proposal, from_drafter = choice.candidate.tree, []
        self._last = _Round(
            len(context), calibration, choice, proposal, from_drafter, candidates, drafted, now
        )
        self._last.timed, self._first = not self._first, False
        return proposal
