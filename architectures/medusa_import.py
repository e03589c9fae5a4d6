"""Medusa heads in the peers' layouts -> draftzoo's Medusa-1 heads (the family's `importers`,
architectures/peer_import.py).

- `vllm`: vLLM's `MedusaModel` (`blocks.{h}.layers.{l}.*`, `lm_heads.{h}.weight`, `token_map`
  when `truncated_vocab_size` is below the vocabulary): draftzoo's own names. Blocks without a
  bias (`medusa_fc_bias: false`) get a zero one, which computes the same.
- `medusa`: the Medusa reference code's heads (`medusa_lm_head.safetensors`, or its older
  `medusa_lm_head.pt` with `--allow-pickle`): head h is `Sequential(ResBlock * L, Linear)`, so
  `{h}.{l}.linear.*` are its blocks and `{h}.{L}.weight` its projection. The reference repeats
  one block object L times (the same weights in every layer); each of draftzoo's layers gets a
  copy, which computes the same.

Both read the target's final post-norm state (HF index N), as draftzoo's heads do.
"""

from __future__ import annotations

import re

import torch

from .peer_import import Imported, PeerFolder, PeerImportError, named_verifier

REFERENCE_BLOCK = re.compile(r"^(\d+)\.(\d+)\.linear\.(weight|bias)$")


def import_vllm(peer: PeerFolder, target) -> Imported | None:
    """vLLM's `MedusaModel` folder."""
    keys = peer.keys
    if "MedusaModel" not in peer.architectures() and "lm_heads.0.weight" not in keys:
        return None
    config = peer.config
    heads, layers = config.get("num_heads"), config.get("num_hidden_layers")
    if not isinstance(heads, int) or not isinstance(layers, int):
        raise PeerImportError(f"{peer.path}: a MedusaModel config names num_heads and layers")
    tensors, notes = dict(peer.tensors), []
    hidden = target.hidden_size
    for h in range(heads):
        for layer in range(layers):
            weight = tensors.get(f"blocks.{h}.layers.{layer}.weight")
            bias = f"blocks.{h}.layers.{layer}.bias"
            if bias not in tensors and weight is not None:
                tensors[bias] = torch.zeros(hidden, dtype=weight.dtype)
                notes.append("blocks without a bias: zero biases added")
    truncated = config.get("truncated_vocab_size")
    fields = _fields(target, heads, layers, truncated)
    return Imported(
        "medusa1",
        "vLLM MedusaModel",
        fields,
        tensors,
        [target.num_layers],
        named_verifier(peer),
        tuple(dict.fromkeys(notes)),
    )


def import_reference(peer: PeerFolder, target) -> Imported | None:
    """The Medusa reference code's `medusa_lm_head` file."""
    blocks = [REFERENCE_BLOCK.match(k) for k in peer.keys]
    if not any(blocks):
        return None
    config = peer.config
    heads = config.get("medusa_num_heads")
    layers = config.get("medusa_num_layers")
    if not isinstance(heads, int) or not isinstance(layers, int):
        raise PeerImportError(
            f"{peer.path}: Medusa reference heads need medusa_num_heads and medusa_num_layers "
            "in config.json"
        )
    tensors = {}
    for h in range(heads):
        for layer in range(layers):
            for part in ("weight", "bias"):
                tensors[f"blocks.{h}.layers.{layer}.{part}"] = _need(
                    peer, f"{h}.{layer}.linear.{part}"
                )
        tensors[f"lm_heads.{h}.weight"] = _need(peer, f"{h}.{layers}.weight")
    fields = _fields(target, heads, layers, None)
    return Imported(
        "medusa1", "Medusa reference", fields, tensors, [target.num_layers], named_verifier(peer)
    )


def _need(peer: PeerFolder, key: str) -> torch.Tensor:
    if key not in peer.tensors:
        raise PeerImportError(f"{peer.path}: the Medusa reference tensor {key} is missing")
    return peer.tensors[key]


def _fields(target, heads: int, layers: int, truncated: int | None) -> dict:
    vocab = target.lm_head.weight.shape[0]
    fields = {
        "draftzoo_family": "medusa1",
        "hidden_size": target.hidden_size,
        "vocab_size": vocab,
        "medusa_num_heads": heads,
        "medusa_num_layers": layers,
    }
    if truncated is not None and truncated < vocab:
        fields["truncated_vocab_size"] = int(truncated)
    return fields
