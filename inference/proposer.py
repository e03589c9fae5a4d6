"""What a proposer is to the runtime: where draft tokens come from. Each returns a `Proposal`
(chain or tree); the proposers themselves live in `proposers/`."""

from __future__ import annotations

from typing import Protocol

import torch

from ..architectures.errors import DraftzooError
from .sampling import SamplingParams
from .tree import Proposal


class ProposerError(DraftzooError, ValueError):
    """A proposer that cannot serve this target."""


class Proposer(Protocol):
    """Anything that drafts tokens after `context` (all committed tokens, prompt included).

    These are every call the generate loops make. A class that subclasses `Proposer` inherits
    the defaults below (reads no target states, keeps no cache) and only writes `propose`.
    """

    #: HF hidden-state indices of the target the proposer reads; empty: none
    target_layers: tuple[int, ...] = ()

    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Proposal:
        """A chain or tree of at most `max_tokens` draft tokens on one path."""
        ...

    def reset(self) -> None:
        """Forget the previous request (called before each one)."""

    def observe(self, states: torch.Tensor) -> None:
        """Target states [n, k*h] (the `target_layers`, concatenated) of the next n committed
        positions; called only when `target_layers` is not empty."""

    def cache_nbytes(self) -> int:
        """Bytes of the proposer's own cache, for the memory figures."""
        return 0

    def finish(self, token_ids: list[int]) -> None:
        """The request is done: its every token, prompt and output (proposers that learn
        across requests keep what they need)."""
