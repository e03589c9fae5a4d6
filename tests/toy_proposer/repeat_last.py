"""Repeat-last: propose the context's last token `copies` times (a chain; no model)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import nn

from draftzoo.inference.drafter_runtime import DrafterRuntime
from draftzoo.inference.model_free import ModelFreeSpec
from draftzoo.inference.proposal_settings import ProposalSettings
from draftzoo.inference.proposer import Proposer, ProposerError
from draftzoo.inference.setting_flag import SettingFlag
from draftzoo.inference.tree import Proposal

NAME = "repeat_last"


@dataclass(frozen=True)
class RepeatSettings:
    copies: int = 2  # tokens proposed a round at most

    def __post_init__(self) -> None:
        if self.copies < 1:
            raise ProposerError(f"repeat-last copies must be >= 1, got {self.copies}")


class RepeatLastProposer(Proposer):
    def __init__(self, copies: int) -> None:
        self.copies = copies

    def propose(self, context, max_tokens, params, generator) -> Proposal:
        return Proposal.chain([context[-1]] * min(self.copies, max_tokens))


def repeat_runtime(
    settings: RepeatSettings, proposal: ProposalSettings, tokenizer=None
) -> DrafterRuntime:
    record = {"family": NAME, "copies": settings.copies, "training": {}}
    make = lambda: RepeatLastProposer(settings.copies)  # noqa: E731
    return DrafterRuntime(Path(NAME), record, nn.Module(), make, proposal)


MODEL_FREE_SPEC = ModelFreeSpec(
    name=NAME,
    display_name="repeat last",
    flag="--repeat-last",
    help="propose the last token again",
    settings="tests.toy_proposer.repeat_last:RepeatSettings",
    runtime="tests.toy_proposer.repeat_last:repeat_runtime",
    options=(SettingFlag("--repeat-copies", "copies", int, "repeat-last: tokens a round (2)"),),
)
