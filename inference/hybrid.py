"""Hybrid proposals: a trained drafter's tree and suffix decoding's branches, verified together.

Each round suffix decoding speculates first (cheap: a few dictionary walks). Its score is the
suffix proposal's expected accepted tokens under the counts; the rule calibrates it by what
such rounds measurably delivered, then picks what is verified:

- **suffix alone** when the calibrated score reaches `alone_margin` x the drafter's measured
  accepted tokens per round: the drafter's forward is skipped (its pending target states wait
  for the next round it drafts);
- **both** when the calibrated score is at least `min_score`: the drafter's chain or tree
  with the suffix branches merged in: a suffix node whose parent already has a child of the
  same token follows that child, the others are appended after the drafter's own children;
- **the drafter alone** otherwise (its proposal untouched, on the device where it drafted);
- **nothing** (a plain decoding step, one target forward for one token), or the suffix
  branches alone, while the drafter does not pay: when the rounds it drafts commit fewer
  tokens per second of wall-clock than plain decoding steps (`pace`). Each kind is timed from
  one round's start to the next's; a plain step is probed while the drafter pays and the
  drafter while it does not, every `probe_every` rounds. The suffix branches go alone from a
  calibrated score of `min_score`; with `time_widths`, when their round, expected to commit
  1 + the calibrated score tokens in the seconds that suffix-alone rounds of as many nodes
  measurably took, beats a plain step's pace (verifying a few tokens can cost more than
  verifying more on a CPU), and by `min_score` while that width is untimed and once halfway
  between two probes.

Every measurement is read from the next round's context (which nodes the committed tokens
followed) and kept per sampling temperature (counts overstate what a sampled target accepts):
the drafter's accepted nodes per round it drafted, for each of "suffix alone" and "both"
the suffix nodes accepted against the scores promised, and the seconds and committed tokens of
rounds the drafter drafted and of plain steps (exponential averages; a score is taken as it is
until its kind of round has been measured). Timing makes the choices, not the output, depend
on the machine: greedy output is the target's whatever is proposed, and sampled output is the
target's distribution (a fixed seed no longer fixes the sample, since the proposals differ).

Lossless: suffix nodes are deterministic (q one-hot) and come after the drafter's siblings, so
recursive rejection at every node tests each child against the distribution it was drawn
from (acceptance.py); greedy rounds follow the target's argmax down the merged tree.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from .errors import GenerationError
from .proposers import Proposer
from .sampling import SamplingParams
from .suffix import Speculation, SuffixCache, SuffixProposer, SuffixSettings
from .tree import Proposal

#: the rule's choices, as counted in `HybridProposer.choices` ("none": a plain decoding step)
CHOICES = ("suffix", "both", "drafter", "none")


@dataclass(frozen=True)
class HybridSettings:
    """How the hybrid rule weighs suffix branches against the drafter's."""

    suffix: SuffixSettings = field(default_factory=lambda: SuffixSettings(tree=True))
    #: suffix alone when its calibrated score >= alone_margin x the drafter's accepted tokens
    #: per round
    alone_margin: float = 1.0
    min_score: float = 0.5  # suffix branches join the drafter's from this calibrated score on
    decay: float = 0.8  # weight of the past in every measured average
    #: weigh the drafter's tokens per second against plain decoding's (False: the three
    #: choices by scores alone, whatever a round costs)
    pace: bool = True
    probe_every: int = 32  # rounds between probes of the kind the rule is not choosing
    #: while the drafter does not pay, suffix branches alone by the measured cost of verifying
    #: their width (False: from a calibrated score of min_score)
    time_widths: bool = False

    def __post_init__(self) -> None:
        if self.alone_margin <= 0:
            raise GenerationError(f"hybrid alone_margin must be > 0, got {self.alone_margin}")
        if self.min_score < 0:
            raise GenerationError(f"hybrid min_score must be >= 0, got {self.min_score}")
        if not 0 <= self.decay < 1:
            raise GenerationError(f"hybrid decay must be in [0, 1), got {self.decay}")
        if self.probe_every < 2:
            raise GenerationError(f"hybrid probe_every must be >= 2, got {self.probe_every}")

    def rule(self) -> dict[str, float | bool]:
        """The rule's settings, as reports record them (the suffix settings apart)."""
        names = ("alone_margin", "min_score", "decay", "pace", "probe_every", "time_widths")
        return {name: getattr(self, name) for name in names}


@dataclass
class Delivery:
    """Exponential averages of what one kind of round delivered and what it promised."""

    delivered: float | None = None
    promised: float | None = None

    def add(self, delivered: float, promised: float, decay: float) -> None:
        if self.delivered is None or self.promised is None:
            self.delivered, self.promised = delivered, promised
            return
        self.delivered = decay * self.delivered + (1 - decay) * delivered
        self.promised = decay * self.promised + (1 - decay) * promised

    def calibrate(self, score: float) -> float:
        """`score` scaled by delivered / promised (unchanged before any measured round)."""
        if not self.promised:
            return score
        return score * self.delivered / self.promised


@dataclass
class Pace:
    """Exponential averages of one kind of round's wall-clock seconds and committed tokens."""

    seconds: float | None = None
    tokens: float | None = None

    def add(self, seconds: float, tokens: int, decay: float) -> None:
        if self.seconds is None or self.tokens is None:
            self.seconds, self.tokens = seconds, float(tokens)
            return
        self.seconds = decay * self.seconds + (1 - decay) * seconds
        self.tokens = decay * self.tokens + (1 - decay) * tokens

    def rate(self) -> float | None:
        """Committed tokens per second (None before any measured round)."""
        if self.seconds is None or self.tokens is None:
            return None
        return self.tokens / max(self.seconds, 1e-9)


@dataclass
class Calibration:
    """What each kind of round delivered at one sampling temperature."""

    drafter: Delivery = field(default_factory=Delivery)  # accepted drafter nodes a round (of 1)
    alone: Delivery = field(default_factory=Delivery)  # suffix-alone rounds: accepted / score
    both: Delivery = field(default_factory=Delivery)  # the suffix nodes of "both" rounds
    drafting: Pace = field(default_factory=Pace)  # rounds the drafter drafted ("drafter", "both")
    plain: Pace = field(default_factory=Pace)  # plain decoding steps ("none")
    #: suffix-alone rounds by their number of nodes (what verifying that width costs)
    alone_paces: dict[int, Pace] = field(default_factory=dict)
    rounds: int = 0  # rounds proposed at this temperature (for the probes)

    def suffix_pays(self, expected: float, width: int, min_score: float, by_score: bool) -> bool:
        """Whether suffix branches of `width` nodes, expected to have `expected` tokens
        accepted, go alone rather than a plain step: by the measured paces, or from
        `min_score` on while that width is untimed (and where `by_score`)."""
        timed, plain = self.alone_paces.get(width), self.plain.rate()
        if by_score or timed is None or timed.seconds is None or plain is None:
            return expected >= min_score
        return (1 + expected) / max(timed.seconds, 1e-9) >= plain

    def by_pace(self, probe: bool) -> str:
        """What the measured paces ask of this round: "drafter" (it pays, or is probed), "none"
        (a plain step: to measure one, first after the drafter's first round, then on probes
        while the drafter pays) or "without" (the drafter does not pay: no drafter round)."""
        drafting, plain = self.drafting.rate(), self.plain.rate()
        if drafting is None:
            return "drafter"
        if plain is None:
            return "none"
        if drafting >= plain:
            return "none" if probe else "drafter"
        return "drafter" if probe else "without"


@dataclass
class _Round:
    """What was proposed, to measure what each kind of node delivered."""

    context_length: int
    proposal: Proposal
    from_drafter: list[bool] | None  # per node; None: every node is the drafter's
    choice: str  # one of CHOICES
    calibration: Calibration
    score: float = 0.0  # the suffix proposal's score (0 when it had none)
    started: float = 0.0  # time.perf_counter() when the round's proposal began


def merge(proposal: Proposal, found: Speculation) -> tuple[Proposal, list[bool]]:
    """The drafter's `proposal` with the suffix branches of `found` merged in (appended after
    the drafter's nodes, one-hot q where the drafter's nodes carry theirs); which nodes are the
    drafter's."""
    tokens, parents = list(proposal.tokens), list(proposal.parents)
    from_drafter = [True] * len(tokens)
    children: dict[tuple[int, int], int] = {}
    for index, (token, parent) in enumerate(zip(tokens, parents, strict=True)):
        children.setdefault((parent, token), index)
    placed: list[int] = []  # suffix node -> merged index
    for token, parent in zip(found.tokens, found.parents, strict=True):
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


def accepted_nodes(proposal: Proposal, committed: list[int]) -> list[int]:
    """The nodes the committed tokens followed from the root, in order."""
    path, slot = [], 0
    for token in committed:
        match = next((c for c in proposal.children[slot] if proposal.tokens[c] == token), None)
        if match is None:
            break
        path.append(match)
        slot = match + 1
    return path


class HybridProposer(Proposer):
    """A drafter that drafts trees (or chains), with suffix decoding's branches beside it."""

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
        self._last: _Round | None = None

    def observe(self, states: torch.Tensor) -> None:
        self.drafter.observe(states)

    def cache_nbytes(self) -> int:
        return self.drafter.cache_nbytes()

    def finish(self, token_ids: list[int]) -> None:
        self.drafter.finish(token_ids)
        self.suffix.finish(token_ids)

    def _measure(self, context: list[int], now: float) -> None:
        """What the last round's drafter and suffix nodes delivered, and how long the round
        took (proposal to proposal), into its calibration."""
        last, self._last = self._last, None
        if last is None:
            return
        decay, calibration = self.settings.decay, last.calibration
        committed = context[last.context_length :][:-1]  # the last token is the target's
        if last.choice in ("drafter", "both"):
            calibration.drafting.add(now - last.started, len(committed) + 1, decay)
        elif last.choice == "none":
            calibration.plain.add(now - last.started, len(committed) + 1, decay)
        if last.choice == "suffix":
            calibration.alone.add(len(committed), last.score, decay)
            pace = calibration.alone_paces.setdefault(len(last.proposal), Pace())
            pace.add(now - last.started, len(committed) + 1, decay)
        if last.choice in ("suffix", "none"):
            return
        if last.from_drafter is None:  # every node the drafter's: no walk (nor host read)
            mine, theirs = len(committed), 0
        else:
            path = accepted_nodes(last.proposal, committed)
            mine = sum(1 for node in path if last.from_drafter[node])
            theirs = len(path) - mine
        calibration.drafter.add(mine, 1.0, decay)
        if last.choice == "both":
            calibration.both.add(theirs, last.score, decay)

    def _choose(self, found: Speculation | None, calibration: Calibration) -> str:
        """The rule: one of CHOICES for this round."""
        settings = self.settings
        expected = calibration.drafter.delivered
        calibrated = -1.0 if found is None else calibration.alone.calibrate(found.score)
        if expected is not None and calibrated >= settings.alone_margin * expected:
            return "suffix"
        if settings.pace:
            step = calibration.rounds % settings.probe_every
            pace = calibration.by_pace(step == 0)
            if pace == "without":
                if found is None:
                    return "none"
                by_score = not settings.time_widths or step == settings.probe_every // 2
                width = len(found.tokens)
                alone = calibration.suffix_pays(calibrated, width, settings.min_score, by_score)
                return "suffix" if alone else "none"
            if pace == "none":
                return "none"
        if found is None or calibration.both.calibrate(found.score) < settings.min_score:
            return "drafter"
        return "both"

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
        found = self.suffix.speculation(context, max_tokens)
        calibration = self.calibrations.setdefault(params.temperature, Calibration())
        calibration.rounds += 1
        choice = self._choose(found, calibration)
        self.choices[choice] += 1
        if choice == "none":
            self._last = _Round(len(context), Proposal.chain([]), [], "none", calibration)
            self._last.started = now
            return self._last.proposal
        if choice == "suffix":
            assert found is not None
            proposal = Proposal(found.tokens, found.parents)
            alone = [False] * len(proposal)
            self._last = _Round(len(context), proposal, alone, "suffix", calibration, found.score)
            self._last.started = now
            return proposal
        proposal = self.drafter.propose(context, max_tokens, params, generator)
        if choice == "drafter":
            self._last = _Round(len(context), proposal, None, "drafter", calibration)
        else:
            assert found is not None
            proposal, from_drafter = merge(proposal, found)
            self._last = _Round(len(context), proposal, from_drafter, "both", calibration)
            self._last.score = found.score
        self._last.started = now
        return proposal
