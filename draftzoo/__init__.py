"""draftzoo: train, measure, publish and serve speculative-decoding drafters.

The public API is re-exported lazily, so `import draftzoo` (and the CLI's --help) stays fast
and `draftzoo.inference` never pulls in the training stack.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "TargetAdapter": "draftzoo.architectures.target",
    "TargetFingerprint": "draftzoo.architectures.target",
    "SpeculativeGenerator": "draftzoo.inference.generate",
    "CacheSettings": "draftzoo.inference.cache_settings",
    "SamplingParams": "draftzoo.inference.sampling",
    "Proposal": "draftzoo.inference.tree",
    "DraftModelProposer": "draftzoo.inference.proposers.draft_lm",
    "PromptLookupProposer": "draftzoo.inference.proposers.prompt_lookup",
    "EagleProposer": "draftzoo.inference.proposers.eagle",
    "TreeSettings": "draftzoo.inference.proposers.eagle",
    "PositionTree": "draftzoo.inference.proposers.position_tree",
    "SuffixSettings": "draftzoo.inference.proposers.suffix",
    "HybridSettings": "draftzoo.inference.proposers.hybrid",
    "load": "draftzoo.inference.load",
    "export_drafter": "draftzoo.architectures.export",
    "DraftzooError": "draftzoo.architectures.errors",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'draftzoo' has no attribute {name!r}")
