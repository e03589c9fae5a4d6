"""The draft-LM family's runtime: a small causal LM on the target's tokenizer drafts chains
(`DraftModelProposer`)."""

from __future__ import annotations

from pathlib import Path

from ..architectures.drafter_io import DrafterError, check_drafter_target
from ..architectures.safe_load import load_causal_lm, load_tokenizer
from ..architectures.target import TargetAdapter
from .drafter_request import DrafterRequest, LoadedDrafter
from .proposers import DraftModelProposer, Proposer, ProposerError, vocabularies_match


def load_runtime(folder, record: dict, target, tokenizer, request: DrafterRequest):
    """A draft LM sharing the target's tokenizer, loaded for `target` (the draft-LM family's
    `runtime`; chains only)."""

    check_drafter_target(folder, TargetAdapter(target, tokenizer).fingerprint(), record)
    if not vocabularies_match(load_tokenizer(folder), tokenizer):
        raise ProposerError(f"drafter {folder} does not share the target's tokenizer")
    if not (Path(folder) / "model.safetensors").is_file():
        raise DrafterError(
            f"drafter {folder} has no model.safetensors; draftzoo reads drafters as safetensors "
            "and JSON only (a pickle-based file such as pytorch_model.bin could run code)"
        )
    draft = load_causal_lm(folder, dtype=target.dtype)
    draft = draft.to(next(target.parameters()).device).eval()

    def make() -> Proposer:
        return DraftModelProposer(draft, None, None, request.cache)

    return LoadedDrafter(draft, make)
