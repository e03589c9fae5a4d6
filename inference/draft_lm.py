"""The draft-LM family's runtime: a small causal LM on the target's tokenizer drafts chains
(`DraftModelProposer`)."""

from __future__ import annotations

from ..architectures.drafter_files import DrafterFiles, opened
from ..architectures.drafter_io import DrafterError
from ..architectures.safe_load import load_tokenizer
from ..architectures.target import TargetAdapter
from .drafter_request import DrafterRequest, LoadedDrafter
from .proposers import DraftModelProposer, Proposer, ProposerError, vocabularies_match


def load_runtime(folder, record: dict, target, tokenizer, request: DrafterRequest):
    """A draft LM sharing the target's tokenizer, loaded for `target` (the draft-LM family's
    `runtime`; chains only), built from the files the front door read."""
    files = opened(folder, request.files)
    files.check_target(TargetAdapter(target, tokenizer).fingerprint())
    if not vocabularies_match(load_tokenizer(folder), tokenizer):
        raise ProposerError(f"drafter {folder} does not share the target's tokenizer")
    draft = causal_lm(files, target.dtype).to(next(target.parameters()).device).eval()

    def make() -> Proposer:
        return DraftModelProposer(draft, None, None, request.cache)

    return LoadedDrafter(draft, make)


def causal_lm(files: DrafterFiles, dtype):
    """The transformers causal LM whose config and weights `files` hold (its own classes only:
    a config naming code of its own is refused by transformers without trust_remote_code)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = files.json()
    model_type = fields.pop("model_type", None)
    if not isinstance(model_type, str):
        raise DrafterError(f"{files.folder}/config.json names no transformers model_type")
    config = AutoConfig.for_model(model_type, **fields)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    loaded = model.load_state_dict(files.weights(), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [key for key in loaded.missing_keys if key not in tied]
    if missing or loaded.unexpected_keys:
        raise DrafterError(
            f"{files.folder}: weights do not match its config (missing {missing[:4]}, "
            f"unexpected {loaded.unexpected_keys[:4]})"
        )
    model.tie_weights()
    return model
