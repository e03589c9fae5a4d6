"""The hybrid's rule: what each kind of round measurably delivers and costs, and the choice.

Model-free candidates (prompt lookup's n-gram copy, suffix decoding's branches) are measured in
every round, whatever was verified: once the tokens after a round are committed, each candidate
that round had is walked along them (`Yields`), which is what verifying it would have accepted
(exactly at T = 0; at T > 0 in distribution, since a one-hot draft token is accepted with the
target's probability of it, the probability that the committed token is it). So a candidate
measured as poor is re-measured every round, free. The drafter is measured only when it drafts:
its accepted nodes per round, and what merging each candidate into its proposal added.
Rounds are timed by (drafted or not, nodes verified): on a CPU verifying 2-3 tokens can cost
more than verifying 5 (`Paces`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from ..errors import GenerationError
from ..tree import Proposal
from .suffix import SuffixSettings

#: the rule's choices, as counted in `HybridProposer.choices` ("none": a plain decoding step)
CHOICES = ("lookup", "suffix", "both", "drafter", "none")
DRAFTED = ("drafter", "both")  # the choices whose rounds the drafter drafts
#: candidates are measured apart by their match: the n-gram's length for prompt lookup, the
#: suffix's score (expected accepted tokens under the counts) in halves for suffix decoding
MAX_BUCKET = 8
#: a round's seconds count at most this many times their kind's average so far
CLIP_SECONDS = 2.0


@dataclass(frozen=True)
class HybridSettings:
    """How the hybrid rule weighs the model-free candidates against the drafter."""

    suffix: SuffixSettings = field(default_factory=lambda: SuffixSettings(tree=True))
    #: prompt lookup's n-gram copy is a candidate every round (False: suffix branches only)
    lookup: bool = True
    #: without pace: a candidate alone from alone_margin x the drafter's accepted tokens a round
    alone_margin: float = 1.0
    min_score: float = 0.5  # without pace: a candidate merged from this expected yield on
    decay: float = 0.8  # weight of the past in the averages measured every round
    #: weight of the past in the drafter's yield and merge gains (measured only in the rounds
    #: it drafts, each of them noisy: kept longer)
    drafter_decay: float = 0.95
    #: by the measured tokens per second of each kind of round (False: no clock, by yields)
    pace: bool = True
    probe_every: int = 32  # rounds after which the drafter (and a plain step) is tried again
    #: by pace, a round changes between drafting and not only for an expected pace this much
    #: higher (after rounds without it the drafter catches up; noisy measures would flap)
    switch_margin: float = 0.1

    def __post_init__(self) -> None:
        if self.alone_margin <= 0:
            raise GenerationError(f"hybrid alone_margin must be > 0, got {self.alone_margin}")
        if self.min_score < 0:
            raise GenerationError(f"hybrid min_score must be >= 0, got {self.min_score}")
        for name in ("decay", "drafter_decay"):
            if not 0 <= getattr(self, name) < 1:
                raise GenerationError(f"hybrid {name} must be in [0, 1), got {getattr(self, name)}")
        if self.switch_margin < 0:
            raise GenerationError(f"hybrid switch_margin must be >= 0, got {self.switch_margin}")
        if self.probe_every < 2:
            raise GenerationError(f"hybrid probe_every must be >= 2, got {self.probe_every}")

    def rule(self) -> dict[str, float | bool]:
        """The rule's settings, as reports record them (the suffix settings apart)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "suffix"}


@dataclass
class Mean:
    """The average of the values added so far, then (once 1 / (1 - decay) are in) an
    exponential average; None before the first value."""

    value: float | None = None
    count: int = 0

    def add(self, value: float, decay: float, clip: float | None = None) -> None:
        """Add `value` (at most `clip` x the average so far, when given: one stalled round
        must not price a kind of round out for many)."""
        self.count += 1
        if self.value is None:
            self.value = value
            return
        if clip is not None:
            value = min(value, clip * self.value)
        weight = max(1 - decay, 1 / self.count)
        self.value = (1 - weight) * self.value + weight * value


@dataclass(frozen=True)
class Candidate:
    """A model-free proposal offered this round."""

    source: str  # "lookup" or "suffix"
    tree: Proposal  # deterministic nodes (one-hot q)
    bucket: int  # see MAX_BUCKET
    prior: float = 0.0  # its expected yield until its kind is measured (suffix: its score)

    @property
    def key(self) -> tuple[str, int]:
        return self.source, self.bucket


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


@dataclass
class Calibration:
    """What each kind of round delivered and cost at one sampling temperature."""

    #: accepted nodes per round: each candidate kind's (by `Candidate.key`), walked every round
    yields: dict[tuple[str, int], Mean] = field(default_factory=dict)
    #: what merging a candidate kind into the drafter's proposal added, in rounds it drafted
    gains: dict[tuple[str, int], Mean] = field(default_factory=dict)
    drafter: Mean = field(default_factory=Mean)  # the drafter's accepted nodes a drafted round
    #: round seconds by (the drafter drafted, nodes verified); (False, 0) is a plain step
    seconds: dict[tuple[bool, int], Mean] = field(default_factory=dict)
    drafter_width: int = 0  # nodes of the drafter's last proposal
    rounds: int = 0  # rounds proposed at this temperature
    last: dict[str, int] = field(default_factory=dict)  # "drafter" / "none": last round chosen
    drafted: bool | None = None  # whether the drafter drafted the last round

    def expected(
        self, table: dict[tuple[str, int], Mean], key: tuple[str, int], prior: float = 0.0
    ) -> float:
        """A candidate kind's measured yield (or merge gain); `prior` until measured."""
        mean = table.get(key)
        return prior if mean is None or mean.value is None else mean.value

    def round_seconds(self, drafted: bool, width: int) -> float | None:
        """A round's measured seconds, from the nearest width timed (None: none timed)."""
        timed = {w: m.value for (d, w), m in self.seconds.items() if d == drafted and m.value}
        if not timed:
            return None
        return timed[min(timed, key=lambda w: (abs(w - width), w))]


@dataclass(frozen=True)
class Choice:
    """The rule's pick: one of CHOICES, with the candidate it verifies (or merges)."""

    kind: str
    candidate: Candidate | None = None


def choose(
    calibration: Calibration, candidates: list[Candidate], settings: HybridSettings
) -> Choice:
    """This round's choice. By pace: the drafter until measured and timed, then a plain step,
    then the highest expected committed tokens per second among a plain step, each candidate
    alone, the drafter, and the drafter with a candidate merged (a change between drafting and
    not only for `switch_margin` more); the drafter and a plain step are probed when not chosen
    for a while: every `probe_every` rounds when measured far behind, more often the closer
    they are or the fewer times measured (`_interval`). By counts (no clock): the
    best-yielding candidate merged from `min_score`, alone from `alone_margin` x the drafter's
    yield (once measured, and not when the drafter is due a probe), else the drafter."""
    drafter, probe_every = calibration.drafter.value, settings.probe_every
    if not settings.pace:
        yields = [(calibration.expected(calibration.yields, c.key, c.prior), c) for c in candidates]
        expected, best = max(yields, key=lambda pair: pair[0], default=(-1.0, None))
        if best is None or expected < settings.min_score:
            return Choice("drafter")
        probe = calibration.rounds - calibration.last.get("drafter", 0) >= probe_every
        if drafter is not None and not probe and expected >= settings.alone_margin * drafter:
            return Choice(best.source, best)
        return Choice("both", best)
    if drafter is None or calibration.round_seconds(True, calibration.drafter_width) is None:
        return Choice("drafter")
    if calibration.round_seconds(False, 0) is None:
        return Choice("none")
    options = _rates(calibration, candidates, drafter)
    best_rate, best = max(options, key=lambda option: option[0])
    if calibration.drafted is not None and (best.kind in DRAFTED) != calibration.drafted:
        stay = [option for option in options if (option[1].kind in DRAFTED) == calibration.drafted]
        stay_rate, stayed = max(stay, key=lambda option: option[0])
        if best_rate < (1 + settings.switch_margin) * stay_rate:
            best_rate, best = stay_rate, stayed
    measured = {"drafter": calibration.drafter, "none": calibration.seconds[(False, 0)]}
    for kind, probed in (("drafter", DRAFTED), ("none", ("none",))):
        if best.kind in probed:
            continue
        rate = max(r for r, choice in options if choice.kind in probed)
        interval = _interval(rate / best_rate, measured[kind].count, probe_every)
        if calibration.rounds - calibration.last.get(kind, 0) >= interval:
            return Choice(kind)
    return best


def _rates(
    calibration: Calibration, candidates: list[Candidate], drafter: float
) -> list[tuple[float, Choice]]:
    """Each choice's expected committed tokens per second (a plain step first: it wins ties)."""
    options = [(1.0 / calibration.round_seconds(False, 0), Choice("none"))]
    for candidate in candidates:
        delivered = 1 + calibration.expected(calibration.yields, candidate.key, candidate.prior)
        seconds = calibration.round_seconds(False, len(candidate.tree))
        options.append((delivered / seconds, Choice(candidate.source, candidate)))
    width = calibration.drafter_width
    options.append(((1 + drafter) / calibration.round_seconds(True, width), Choice("drafter")))
    for candidate in candidates:
        gain = calibration.expected(calibration.gains, candidate.key)
        if gain > 0:
            seconds = calibration.round_seconds(True, width + len(candidate.tree))
            options.append(((1 + drafter + gain) / seconds, Choice("both", candidate)))
    return options


def _interval(ratio: float, count: int, probe_every: int) -> int:
    """Rounds between probes of a choice measured `count` times at `ratio` of the best's rate:
    `probe_every` when 25 % behind, proportionally fewer the closer it is (from 2: a noisy
    measure may have put it behind), up to 4 x `probe_every` when far behind (each probe costs
    what it is behind); at most twice its count (a measure of few rounds is retried soon)."""
    behind = math.ceil(probe_every * min(4.0, 4 * (1 - ratio)))
    return max(2, min(behind, 2 * count))
