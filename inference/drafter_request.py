"""What loading a drafter asks of its family, and what the family gives back.

`load_drafter` (inference/load.py) reads the drafter's record once, finds the family's
`runtime` in the registry and calls it as `runtime(folder, record, target, tokenizer,
request)`; the family builds its module once and returns a `LoadedDrafter`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .cache_settings import GROWING, CacheSettings
from .proposal_settings import OWN_TREE, ProposalSettings
from .proposer import Proposer


@dataclass(frozen=True)
class DrafterRequest:
    """How the caller wants the drafter to propose (the hybrid's rule is the loader's: a family
    sees what it drafts itself)."""

    settings: ProposalSettings = field(default_factory=ProposalSettings)
    cache: CacheSettings = GROWING  # the drafter's cache, as the target's
    #: the folder's files as the front door read them (`DrafterFiles`): build from these
    files: Any = None

    @property
    def drafts_tree(self) -> bool:
        return self.settings.drafts_tree

    @property
    def num_speculative_tokens(self) -> int | None:
        """Chain length; None: adaptive."""
        return self.settings.num_speculative_tokens

    def tree_or(self, own: Any) -> Any:
        """The tree asked for (of the family's kind, checked by the loader), or `own` when the
        family's own tree was asked for; None for chains."""
        if not self.drafts_tree:
            return None
        return own if self.settings.tree is OWN_TREE else self.settings.tree


@dataclass
class LoadedDrafter:
    """A family's answer: its module, one proposer per request, and the tree it drafts."""

    module: nn.Module  # the drafter's own weights (shared target weights excluded)
    make_proposer: Callable[[], Proposer]
    tree: Any = None  # the tree it drafts (a tree of its family's kind), None for chains
