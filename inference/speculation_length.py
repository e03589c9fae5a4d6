"""How many tokens to draft per round: fixed, or chosen from measured acceptance and cost.

With per-token acceptance rate alpha and draft/verify cost ratio c (one draft step over one
target forward), drafting gamma tokens yields an expected speedup of

    S(gamma) = (1 - alpha^(gamma + 1)) / ((1 - alpha) * (gamma * c + 1))

(Leviathan et al., 2023). The adaptive policy measures alpha and c on the running request and
drafts the gamma that maximises S, so a weak or expensive drafter falls back towards plain
decoding and a strong, cheap one drafts long.
"""

from __future__ import annotations

from dataclasses import dataclass


def expected_speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    """S(gamma) above; gamma = 0 is plain decoding (1.0)."""
    if gamma == 0:
        return 1.0
    alpha = min(max(alpha, 0.0), 0.999999)
    tokens = (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)
    return tokens / (gamma * cost_ratio + 1.0)


def best_gamma(alpha: float, cost_ratio: float, max_gamma: int) -> int:
    """The gamma in 0..max_gamma with the highest expected speedup (shortest on ties)."""
    return max(range(max_gamma + 1), key=lambda g: (expected_speedup(alpha, g, cost_ratio), -g))


@dataclass
class AdaptiveLength:
    """Per-request gamma from measured acceptance and cost, re-chosen every round.

    Until `warmup_rounds` drafting rounds are measured, it drafts `initial`. It never goes
    below 1 for more than `probe_every` rounds, so a request whose acceptance improves can
    return to drafting.
    """

    max_gamma: int = 8
    initial: int = 4
    warmup_rounds: int = 2
    probe_every: int = 8
    prior_tested: float = 2.0  # pseudo-counts: alpha starts at prior_accepted / prior_tested
    prior_accepted: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.initial <= self.max_gamma:
            raise ValueError("need 1 <= initial <= max_gamma")
        self.reset()

    def reset(self) -> None:
        """Forget the measurements (a new request)."""
        self.tested = self.prior_tested
        self.accepted = self.prior_accepted
        self.draft_seconds_per_token = 0.0
        self.verify_seconds_per_forward = 0.0
        self.drafting_rounds = 0
        self.rounds_without_draft = 0

    @property
    def alpha(self) -> float:
        return self.accepted / self.tested

    def observe(
        self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float
    ) -> None:
        """Record one round: tokens drafted and accepted, and what drafting/verifying cost."""
        if drafted == 0:
            self.rounds_without_draft += 1
            return
        self.rounds_without_draft = 0
        self.drafting_rounds += 1
        self.accepted += accepted
        self.tested += accepted + (1 if accepted < drafted else 0)
        weight = 1.0 / self.drafting_rounds  # running means
        self.draft_seconds_per_token += weight * (
            draft_seconds / drafted - self.draft_seconds_per_token
        )
        self.verify_seconds_per_forward += weight * (
            verify_seconds - self.verify_seconds_per_forward
        )

    def choose(self, room: int) -> int:
        """gamma for the next round, at most `room`."""
        if self.drafting_rounds < self.warmup_rounds:
            gamma = self.initial
        else:
            cost = self.draft_seconds_per_token / max(self.verify_seconds_per_forward, 1e-9)
            gamma = best_gamma(self.alpha, cost, self.max_gamma)
            if gamma == 0 and self.rounds_without_draft >= self.probe_every:
                gamma = 1
        return max(0, min(gamma, room))
