"""EAGLE-1 and EAGLE-3 drafters in the peers' layouts -> draftzoo's (the families' `importers`,
architectures/peer_import.py).

- `speculators` (its `save_pretrained`): `speculators_model_type: eagle3`; `layers.0.*` ->
  `midlayer.*`; layers from `eagle_aux_hidden_state_layer_ids` (HF indices).
- `eagle3` (SpecForge, SGLang, vLLM `LlamaForCausalLMEagle3`, the EAGLE reference): `midlayer.*`
  and `fc` over three states, names as draftzoo's; layers from vLLM's top-level
  `eagle_aux_hidden_state_layer_ids` or SGLang's `eagle_config.eagle_aux_hidden_state_layer_ids`
  + 1 (it counts layer outputs).
- `eagle1` (vLLM `EagleLlamaForCausalLM`, the EAGLE reference): `fc` over two inputs and
  `layers.0.*` -> `midlayer.*`; reads the final state N.

Without layer ids, EAGLE-3 reads the engines' default, HF indices 2, N/2 and N - 3.
An `embed_tokens` tensor must be the target's own (draftzoo shares the target's; a drafter that
trained its own embedding computes something else and is refused). EAGLE-1's layer-0
`input_layernorm`, which the reference stores but never applies (and vLLM deletes), is dropped.
A layer that norms differently from draftzoo's (speculators' `norm_before_residual`,
`norm_before_fc`, `fc_norm`, `norm_output`) or whose hidden size differs from the target's is
refused: draftzoo's module would compute something else from the same weights.
"""

from __future__ import annotations

from typing import Any

import torch

from .eagle import ARCHITECTURES
from .peer_import import (
    Imported,
    PeerFolder,
    PeerImportError,
    drop_target_copy,
    layer_fields,
    named_verifier,
)

#: speculators' switches of its EAGLE-3 layer whose True draftzoo's layer does not compute
SPECULATORS_FALSE = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def import_speculators(peer: PeerFolder, target) -> Imported | None:
    """speculators' `Eagle3Speculator` (what its `save_pretrained` writes)."""
    config = peer.config
    if config.get("speculators_model_type") != "eagle3":
        return None
    for switch in SPECULATORS_FALSE:
        if config.get(switch):
            raise PeerImportError(
                f"{peer.path}: {switch} is true; draftzoo's EAGLE-3 layer computes it false "
                "(norm on the fused state after the residual, no extra norms), so the same "
                "weights would draft other tokens"
            )
    tensors = {k.replace("layers.0.", "midlayer.", 1): v for k, v in peer.tensors.items()}
    layers = config.get("eagle_aux_hidden_state_layer_ids") or _default_layers(target)
    llama = config.get("transformer_layer_config") or {}
    return _eagle3(peer, target, "speculators Eagle3Speculator", llama, tensors, list(layers))


def import_eagle3(peer: PeerFolder, target) -> Imported | None:
    """`LlamaForCausalLMEagle3` (SpecForge, SGLang, vLLM) and the EAGLE reference's EAGLE-3."""
    keys = peer.keys
    if peer.config.get("speculators_model_type") or "fc.weight" not in keys:
        return None
    if not any(k.startswith("midlayer.") for k in keys):
        return None
    if peer.config.get("norm_before_residual"):
        raise PeerImportError(
            f"{peer.path}: norm_before_residual is true; draftzoo's EAGLE-3 layer adds the "
            "residual before the hidden norm, so the same weights would draft other tokens"
        )
    layers = _eagle3_layers(peer.config, target)
    name = "/".join(peer.architectures()) or "EAGLE-3 reference"
    return _eagle3(peer, target, name, peer.config, dict(peer.tensors), layers)


def import_eagle1(peer: PeerFolder, target) -> Imported | None:
    """vLLM's `EagleLlamaForCausalLM` and the EAGLE reference's EAGLE-1."""
    keys, hidden = peer.keys, target.hidden_size
    if "fc.weight" not in keys or "layers.0.self_attn.q_proj.weight" not in keys:
        return None
    if peer.tensors["fc.weight"].shape[-1] != 2 * hidden:
        return None
    if any(not k.startswith(("fc.", "layers.0.", "embed_tokens.")) for k in keys):
        return None  # EAGLE-1 is fc and one layer: anything else (a norm, a head) is not it
    tensors, notes = {}, []
    for key, value in peer.tensors.items():
        if key == "layers.0.input_layernorm.weight":
            notes.append("dropped layers.0.input_layernorm (unused by EAGLE-1's first layer)")
            continue
        tensors[key.replace("layers.0.", "midlayer.", 1)] = value
    drop_target_copy(peer, tensors, "embed_tokens.weight", target.embed_tokens.weight)
    fields = _fields("eagle1", peer.config, target, _vocab(target), "fc.bias" in tensors)
    layers = [target.num_layers]
    config = _config(fields, layers)
    name = "/".join(peer.architectures()) or "EAGLE-1 reference"
    return Imported("eagle1", name, config, tensors, layers, named_verifier(peer), tuple(notes))


def _eagle3(peer, target, layout: str, llama: dict, tensors: dict, layers: list[int]):
    hidden = target.hidden_size
    fc = tensors.get("fc.weight")
    if fc is None or fc.shape[-1] != 3 * hidden:
        shape = None if fc is None else tuple(fc.shape)
        raise PeerImportError(
            f"{peer.path}: fc.weight {shape} does not fuse three states of the target's "
            f"hidden size {hidden}"
        )
    drop_target_copy(peer, tensors, "embed_tokens.weight", target.embed_tokens.weight)
    vocab = _vocab(target)
    head = tensors.get("lm_head.weight")
    draft_vocab = int(peer.config.get("draft_vocab_size") or (len(head) if head is not None else 0))
    if "d2t" not in tensors and draft_vocab == vocab:  # a full vocabulary needs no map
        tensors["d2t"] = torch.zeros(vocab, dtype=torch.long)
        tensors["t2d"] = torch.ones(vocab, dtype=torch.bool)
    for key, kind in (("d2t", torch.long), ("t2d", torch.bool)):
        if key in tensors:
            tensors[key] = tensors[key].to(kind)
    fields = _fields("eagle3", llama, target, draft_vocab, "fc.bias" in tensors)
    config = _config(fields, layers)
    return Imported("eagle3", layout, config, tensors, layers, named_verifier(peer))


def _eagle3_layers(config: dict[str, Any], target) -> list[int]:
    """HF indices from vLLM's top-level ids (the same convention) or SGLang's nested ones
    (outputs of layers: + 1); the engines' default when neither is given."""
    if config.get("eagle_aux_hidden_state_layer_ids"):
        return list(config["eagle_aux_hidden_state_layer_ids"])
    nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if nested:
        return [int(k) + 1 for k in nested]
    return _default_layers(target)


def _vocab(target) -> int:
    return target.lm_head.weight.shape[0]


def _default_layers(target) -> list[int]:
    n = target.num_layers
    return [2, n // 2, n - 3]


def _fields(kind: str, llama: dict, target, draft_vocab: int, fc_bias: bool) -> dict[str, Any]:
    """draftzoo's config.json fields for the peer's decoder layer (Llama names)."""
    from transformers import LlamaConfig

    layer, shape = layer_fields(LlamaConfig, llama, target)
    if getattr(layer, "attention_bias", False) or getattr(layer, "mlp_bias", False):
        raise PeerImportError("the drafter's layer has biases; draftzoo's EAGLE layer has none")
    return {
        "model_type": "llama",
        "eagle_kind": kind,
        **shape,
        "num_hidden_layers": 1,
        "vocab_size": _vocab(target),
        "draft_vocab_size": draft_vocab,
        "num_fused_layers": 1 if kind == "eagle1" else 3,
        "fc_bias": fc_bias,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }


def _config(fields: dict[str, Any], layers: list[int]) -> dict[str, Any]:
    return {
        **fields,
        "architectures": [ARCHITECTURES[fields["eagle_kind"]]],
        "hidden_state_layers": list(layers),
        "layer_convention": "hf_hidden_states (index k = input to decoder layer k)",
    }
