"""Prompt lookup: copy what followed the last earlier occurrence of the context's final n-gram
(no model), as transformers' `prompt_lookup_num_tokens` and vLLM's ngram proposer do. A
model-free proposer: this file and one line in `model_free.MODEL_FREE_MODULES`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from torch import nn

from ..drafter_runtime import DrafterRuntime
from ..model_free import ModelFreeSpec
from ..proposal_settings import ProposalSettings
from ..proposer import Proposer, ProposerError
from ..setting_flag import SettingFlag
from ..tree import Proposal

#: the family name prompt lookup's reports carry
PROMPT_LOOKUP = "prompt_lookup"

#: prompt lookup's n-gram lengths (transformers' and vLLM's defaults)
MIN_NGRAM, MAX_NGRAM = 1, 3


def lookup_match(
    context: list[int], max_tokens: int, min_ngram: int = MIN_NGRAM, max_ngram: int = MAX_NGRAM
) -> tuple[int, list[int]]:
    """(n, the up to `max_tokens` tokens that followed the most recent earlier occurrence of the
    context's last n tokens), for the longest n in max_ngram..min_ngram that has one; (0, [])
    when none does."""
    length = len(context)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = context[length - n :]
        for start in range(length - n - 1, -1, -1):
            if context[start : start + n] == suffix:
                follow = context[start + n : start + n + max_tokens]
                if follow:
                    return n, follow
    return 0, []


class PromptLookupProposer(Proposer):
    """n-gram lookup in the context (no model): copy what followed the last match.

    Tries the longest suffix n-gram first (max_ngram down to min_ngram) and takes the most
    recent earlier occurrence, as transformers' `prompt_lookup_num_tokens` and vLLM's ngram
    proposer do.
    """

    def __init__(self, min_ngram: int = MIN_NGRAM, max_ngram: int = MAX_NGRAM) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ProposerError(
                f"prompt lookup needs 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}"
            )
        self.min_ngram, self.max_ngram = min_ngram, max_ngram

    def propose(self, context, max_tokens, params, generator) -> Proposal:
        _, follow = lookup_match(context, max_tokens, self.min_ngram, self.max_ngram)
        return Proposal.chain(follow)


@dataclass(frozen=True)
class PromptLookupSettings:
    """The n-gram lengths tried, longest first."""

    min_ngram: int = MIN_NGRAM
    max_ngram: int = MAX_NGRAM

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ProposerError(
                f"prompt lookup needs 1 <= min_ngram <= max_ngram, got {self.min_ngram}, "
                f"{self.max_ngram}"
            )


def prompt_lookup_runtime(
    settings: PromptLookupSettings | None = None,
    proposal: ProposalSettings | None = None,
    tokenizer=None,
) -> DrafterRuntime:
    """Prompt lookup as a runtime `draftzoo eval` can measure (chains of
    `proposal.num_speculative_tokens`)."""
    settings = settings or PromptLookupSettings()
    proposal = proposal or ProposalSettings()

    def make() -> Proposer:
        return PromptLookupProposer(settings.min_ngram, settings.max_ngram)

    record = {"family": PROMPT_LOOKUP, "ngram": list(asdict(settings).values()), "training": {}}
    return DrafterRuntime(Path(PROMPT_LOOKUP), record, nn.Module(), make, proposal)


MODEL_FREE_SPEC = ModelFreeSpec(
    name=PROMPT_LOOKUP,
    display_name="prompt lookup",
    flag="--prompt-lookup",
    help="n-gram prompt lookup: copy what followed the context's last n-gram earlier (no model)",
    settings="draftzoo.inference.proposers.prompt_lookup:PromptLookupSettings",
    runtime="draftzoo.inference.proposers.prompt_lookup:prompt_lookup_runtime",
    options=(
        SettingFlag(
            "--min-ngram", "min_ngram", int, f"prompt lookup: shortest n-gram ({MIN_NGRAM})"
        ),
        SettingFlag(
            "--max-ngram", "max_ngram", int, f"prompt lookup: longest n-gram ({MAX_NGRAM})"
        ),
    ),
)
