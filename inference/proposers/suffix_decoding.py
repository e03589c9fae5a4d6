"""Suffix decoding as a model-free proposer (the algorithm: suffix.py; the cache kept in a file:
suffix_store.py): this file and one line in
`model_free.MODEL_FREE_MODULES`."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from torch import nn

from ..drafter_runtime import DrafterRuntime
from ..model_free import ModelFreeSpec
from ..proposal_settings import ProposalSettings
from ..proposer import Proposer
from ..setting_flag import SettingFlag
from .suffix import SuffixCache, SuffixProposer, SuffixSettings
from .suffix_store import global_cache

#: the family name suffix decoding's reports carry
SUFFIX_DECODING = "suffix_decoding"


def suffix_runtime(
    settings: SuffixSettings | None = None,
    proposal: ProposalSettings | None = None,
    tokenizer=None,
    cache: SuffixCache | None = None,
) -> DrafterRuntime:
    """Suffix decoding as a runtime `draftzoo eval` can measure: chains, or trees of
    continuations when `proposal` drafts trees; every request's proposer shares the global
    `cache` (by default the one the settings describe, emptied before each measured pass)."""
    proposal = proposal or ProposalSettings()
    settings = replace(settings or SuffixSettings(), tree=proposal.drafts_tree)
    cache = cache if cache is not None else global_cache(settings, tokenizer)

    def make() -> Proposer:
        return SuffixProposer(settings, cache)

    record = {"family": SUFFIX_DECODING, "suffix": asdict(settings), "training": {}}
    served = replace(proposal, tree=settings if settings.tree else None)
    return DrafterRuntime(
        Path(SUFFIX_DECODING), record, nn.Module(), make, served, begin_pass=cache.clear
    )


MODEL_FREE_SPEC = ModelFreeSpec(
    name=SUFFIX_DECODING,
    display_name="suffix decoding",
    flag="--suffix",
    help="suffix decoding: continuations the text repeats (no model; --tree: trees of them)",
    settings="draftzoo.inference.proposers.suffix:SuffixSettings",
    runtime="draftzoo.inference.proposers.suffix_decoding:suffix_runtime",
    options=(
        SettingFlag(
            "--suffix-depth", "depth", int, "suffix decoding: longest substring counted (32)"
        ),
        SettingFlag(
            "--suffix-max-draft", "max_draft", int, "suffix decoding: most tokens a round (16)"
        ),
        SettingFlag(
            "--suffix-cache",
            "cache_path",
            str,
            "suffix decoding / --hybrid: keep the global cache of earlier outputs in FILE (read "
            "at start, rewritten after each request)",
            in_eval=False,
        ),
    ),
    tree_kind="draftzoo.inference.proposers.suffix:SuffixSettings",
)
