"""A drafter as the runtime serves it: its module, how it proposes, where it came from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from .proposal_settings import ProposalSettings
from .proposer import Proposer


@dataclass
class DrafterRuntime:
    """A loaded drafter (or a model-free proposer): one proposer per request, and the settings
    it is served with (its tree resolved to the one it drafts, its length to that tree's
    depth)."""

    folder: Path
    record: dict[str, Any]
    module: nn.Module  # the drafter's own weights (shared target weights excluded)
    make_proposer: Callable[[], Proposer]  # one per request (proposers keep per-request state)
    settings: ProposalSettings
    #: called before each measured pass (a temperature, batch size and repeat of `draftzoo
    #: eval`): a proposer that learns across requests forgets earlier passes, so one pass's
    #: prompts never draft from another pass's answers to the same prompts
    begin_pass: Callable[[], None] = lambda: None
    #: the checkpoint hash of the files the module was built from (read before and after)
    sha256: str | None = None

    @property
    def family(self) -> str:
        return self.record["family"]

    @property
    def num_speculative_tokens(self) -> int | None:
        """Draft tokens a round (a tree's depth); None: adaptive."""
        return self.settings.num_speculative_tokens

    @property
    def tree(self) -> Any:
        """The tree it drafts, None for chains."""
        return self.settings.tree
