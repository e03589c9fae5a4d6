"""MTP drafters in the peers' layouts -> draftzoo's (the family's `importers`,
architectures/peer_import.py).

- `speculators`: speculators' `MTPDraftModel` (its `save_pretrained`, `speculators_model_type:
  mtp`): one module over the verifier's final state, `mtp_layers.0.{token_layernorm,
  hidden_layernorm, input_proj, final_layernorm}` around one decoder layer of the verifier's
  class (its `transformer_layer_config`). It projects `cat(norm(embedding), norm(state))` as
  DeepSeek's `eh_proj` does, and runs that one module at every draft step on the previous
  step's output after `final_layernorm`: draftzoo's `normed` hand-over at depth 1 (module 0
  drafts past its depth on its own output). Its rotary positions start each step at the
  step's first position (i where draftzoo uses i + k): one shift for every query and key of a
  step, which rotary attention does not see.

Refused: more than one module, a decoder layer of another class or shape than the target's,
an embedding or head that is not the target's; speculators' `verifier_lm_head` (its loss only)
is dropped.
"""

from __future__ import annotations

import torch

from .peer_import import Imported, PeerFolder, PeerImportError, drop_target_copy, named_verifier

#: speculators' names of the MTP module's own pieces -> transformers' `MtpLayer` names
PIECES = {
    "token_layernorm": "enorm",
    "hidden_layernorm": "hnorm",
    "input_proj": "eh_proj",
    "final_layernorm": "post_norm",
}
THEIRS = {ours: theirs for theirs, ours in PIECES.items()}
PREFIX = "mtp_layers.0."
TRAINING_ONLY = ("verifier_lm_head.weight",)


def import_speculators(peer: PeerFolder, target) -> Imported | None:
    """speculators' `MTPDraftModel` folder."""
    config = peer.config
    if config.get("speculators_model_type") != "mtp":
        return None
    modules = config.get("num_nextn_predict_layers") or 1
    if modules != 1:
        raise PeerImportError(f"{peer.path}: {modules} MTP modules; speculators writes one")
    layer = config.get("transformer_layer_config") or {}
    own = _target_text_config(target).model_type
    if layer.get("model_type") != own:
        raise PeerImportError(
            f"{peer.path}: its MTP layer is a {layer.get('model_type')!r} layer, the target's "
            f"layers are {own!r}"
        )
    tensors = {k: v for k, v in peer.tensors.items() if k not in TRAINING_ONLY}
    drop_target_copy(peer, tensors, "embed_tokens.weight", target.embed_tokens.weight)
    drop_target_copy(peer, tensors, "lm_head.weight", target.lm_head.weight)
    drafter = _empty_drafter(target)
    renamed = {_our_name(peer, key): tensor for key, tensor in tensors.items()}
    _check_shapes(peer, renamed, drafter.state_dict())
    notes = tuple(
        f"dropped {k} (speculators' training loss only)" for k in TRAINING_ONLY if k in peer.keys
    )
    layers, verifier = [target.num_layers], named_verifier(peer)
    fields = dict(drafter.fields)
    return Imported("mtp", "speculators MTPDraftModel", fields, renamed, layers, verifier, notes)


def _target_text_config(target):
    from .mtp import text_config

    return text_config(target.config)


def _empty_drafter(target):
    """A depth-1, `normed` drafter for `target` on the meta device: its fields and shapes."""
    from .mtp import MtpDrafter, target_classes

    layer_class, norm_class = target_classes(target)
    with torch.device("meta"):
        return MtpDrafter(target.config, 1, layer_class, norm_class, target.num_layers, "normed")


def _our_name(peer: PeerFolder, key: str) -> str:
    if not key.startswith(PREFIX):
        raise PeerImportError(f"{peer.path}: {key} is not a tensor of speculators' MTP module")
    rest = key[len(PREFIX) :]
    piece, _, tail = rest.partition(".")
    if piece in PIECES:
        return f"layers.0.{PIECES[piece]}.{tail}"
    return f"layers.0.mtp_block.{rest}"


def _their_name(ours: str) -> str:
    """speculators' name of draftzoo's module tensor `ours` (for messages)."""
    rest = ours.removeprefix("layers.0.")
    piece, _, tail = rest.partition(".")
    if piece in THEIRS:
        return f"{PREFIX}{THEIRS[piece]}.{tail}"
    return PREFIX + rest.removeprefix("mtp_block.")


def _check_shapes(peer: PeerFolder, tensors: dict, wanted: dict) -> None:
    """The peer's tensors are exactly the target-shaped module's, in speculators' names."""
    missing = sorted(_their_name(k) for k in set(wanted) - set(tensors))
    unexpected = sorted(_their_name(k) for k in set(tensors) - set(wanted))
    if missing or unexpected:
        raise PeerImportError(
            f"{peer.path}: its MTP module is not one of the target's layers (missing "
            f"{missing[:4]}, unexpected {unexpected[:4]})"
        )
    for key, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(wanted[key].shape):
            raise PeerImportError(
                f"{peer.path}: {_their_name(key)} has shape {tuple(tensor.shape)}, the "
                f"target's layers need {tuple(wanted[key].shape)}"
            )
