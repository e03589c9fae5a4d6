"""DFlash drafters in the peers' layouts -> draftzoo's (the family's `importers`,
architectures/peer_import.py).

- `engines`: z-lab's `DFlashDraftModel` (what vLLM and SGLang load as `dflash`): Qwen3 fields
  plus `block_size` and `dflash_config.{target_layer_ids, mask_token_id}`; its layer ids count
  layer outputs, so the taps are those ids + 1 (HF indices).
- `speculators`: speculators' `DFlashSpeculator` (its `save_pretrained`): the layer's fields in
  `transformer_layer_config`, taps in `aux_hidden_state_layer_ids` (HF indices).

The weights carry draftzoo's names in both. Refused, since draftzoo's module would compute
something else from them: a reduced draft vocabulary (draftzoo's DFlash reads the target's own
head), `sample_from_anchor` (slot 0 predicting), sliding-window layers, an embedding or head
that is not the target's. What only speculators' training reads (`verifier_norm`,
`verifier_lm_head`) is dropped.
"""

from __future__ import annotations

from typing import Any

from .dflash import ARCHITECTURE
from .peer_import import (
    Imported,
    PeerFolder,
    PeerImportError,
    drop_target_copy,
    layer_fields,
    named_verifier,
)

#: tensors speculators' DFlash keeps for its own training loss only
TRAINING_ONLY = ("verifier_norm.weight", "verifier_lm_head.weight")


def import_engines(peer: PeerFolder, target) -> Imported | None:
    """z-lab's `DFlashDraftModel` folder (vLLM, SGLang)."""
    config = peer.config
    dflash = config.get("dflash_config")
    if config.get("speculators_model_type"):  # speculators names its class DFlashDraftModel too
        return None
    if "DFlashDraftModel" not in peer.architectures() and not isinstance(dflash, dict):
        return None
    dflash = dflash or {}
    ids = dflash.get("target_layer_ids")
    if not ids:
        raise PeerImportError(f"{peer.path}: dflash_config names no target_layer_ids")
    taps = [int(i) + 1 for i in ids]
    return _imported(peer, target, "DFlashDraftModel", config, taps, dflash.get("mask_token_id"))


def import_speculators(peer: PeerFolder, target) -> Imported | None:
    """speculators' `DFlashSpeculator` folder."""
    config = peer.config
    if config.get("speculators_model_type") != "dflash":
        return None
    vocab = target.lm_head.weight.shape[0]
    if config.get("draft_vocab_size") not in (None, vocab) or "d2t" in peer.keys:
        raise PeerImportError(
            f"{peer.path}: a draft vocabulary of {config.get('draft_vocab_size')} tokens; "
            "draftzoo's DFlash reads the target's own head over its whole vocabulary"
        )
    if config.get("sample_from_anchor"):
        raise PeerImportError(
            f"{peer.path}: sample_from_anchor is true (slot 0 predicts); draftzoo's DFlash "
            "drafts from slot 1 on"
        )
    taps = list(config.get("aux_hidden_state_layer_ids") or [])
    if not taps:
        raise PeerImportError(f"{peer.path}: aux_hidden_state_layer_ids is not set")
    fields = {
        **(config.get("transformer_layer_config") or {}),
        "block_size": config.get("block_size"),
    }
    layout = "speculators DFlashSpeculator"
    return _imported(peer, target, layout, fields, taps, config.get("mask_token_id"))


def _imported(peer, target, layout: str, fields: dict, taps: list[int], mask) -> Imported:
    if mask is None:
        raise PeerImportError(f"{peer.path}: no mask_token_id in its config")
    if any(t == "sliding_attention" for t in fields.get("layer_types") or []):
        raise PeerImportError(f"{peer.path}: sliding-window layers; draftzoo's DFlash has none")
    tensors = {k: v for k, v in peer.tensors.items() if k not in TRAINING_ONLY}
    drop_target_copy(peer, tensors, "embed_tokens.weight", target.embed_tokens.weight)
    drop_target_copy(peer, tensors, "lm_head.weight", target.lm_head.weight)
    config = _fields(fields, target, taps, int(mask))
    notes = [
        f"dropped {k} (speculators' training loss only)" for k in TRAINING_ONLY if k in peer.keys
    ]
    return Imported("dflash", layout, config, tensors, taps, named_verifier(peer), tuple(notes))


def _fields(fields: dict[str, Any], target, taps: list[int], mask: int) -> dict[str, Any]:
    """draftzoo's config.json for the peer's Qwen3 layers."""
    from transformers import Qwen3Config

    layer, shape = layer_fields(Qwen3Config, fields, target)
    block = fields.get("block_size")
    if not isinstance(block, int) or block < 2:
        raise PeerImportError(f"block_size {block!r} is not a block of at least 2")
    return {
        "model_type": "qwen3",
        **shape,
        "num_hidden_layers": layer.num_hidden_layers,
        "num_target_layers": target.num_layers,
        "vocab_size": target.lm_head.weight.shape[0],
        "block_size": block,
        "mask_token_id": mask,
        "hidden_state_layers": list(taps),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "architectures": [ARCHITECTURE],
        "layer_convention": "hf_hidden_states (index k = input to decoder layer k)",
    }
