"""What loading a drafter asks of its family, and what the family gives back.

`load_drafter` (inference/load.py) reads the drafter's record once, finds the family's
`runtime` in the registry and calls it as `runtime(folder, record, target, tokenizer,
request)`; the family builds its module once and returns a `LoadedDrafter`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from .cache_settings import GROWING, CacheSettings
from .proposers import Proposer, ProposerError

#: what a proposal may be
PROPOSALS = ("chain", "tree")


@dataclass(frozen=True)
class DrafterRequest:
    """How the caller wants the drafter to propose."""

    proposal: str = "chain"  # "chain" or "tree"
    num_speculative_tokens: int | None = None  # chain length; None: adaptive
    tree: Any = None  # the family's tree object, its published settings (a mapping), or None
    cache: CacheSettings = GROWING  # the drafter's cache, as the target's

    def __post_init__(self) -> None:
        if self.proposal not in PROPOSALS:
            raise ProposerError(f"proposal must be 'chain' or 'tree', got {self.proposal!r}")

    @property
    def published_tree(self) -> Mapping[str, Any] | None:
        """The tree settings a zoo entry published, when that is what was passed."""
        return self.tree if isinstance(self.tree, Mapping) else None


@dataclass
class LoadedDrafter:
    """A family's answer: its module, one proposer per request, and the tree it drafts."""

    module: nn.Module  # the drafter's own weights (shared target weights excluded)
    make_proposer: Callable[[], Proposer]
    tree: Any = None  # the tree it drafts (TreeSettings, PositionTree), None for chains
