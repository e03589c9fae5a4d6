"""The target adapter: one view of any transformers causal LM that drafters learn from.

Hidden-state indices follow the Hugging Face `output_hidden_states` convention throughout
draftzoo: index k is the *input* to decoder layer k, 0 is the embedding output, and
N (= the layer count) is the final post-norm output. Engines disagree by one here (vLLM reads
"input to layer k", SGLang/SpecForge write "output of layer k"); exporters convert, nothing
else does.

States are captured with forward hooks on the stock model, so only the requested layers are
kept (not every layer, as `output_hidden_states=True` would).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .attention_masks import windowed
from .defaults import TARGET_DTYPE_NAMES
from .errors import DraftzooError, TargetError

#: `TARGET_DTYPE_NAMES` as torch dtypes
TARGET_DTYPES = {name: getattr(torch, name) for name in TARGET_DTYPE_NAMES}


class FingerprintMismatchError(DraftzooError, ValueError):
    """A drafter was built for another target or tokenizer."""


@dataclass(frozen=True)
class TargetFingerprint:
    """What a drafter must agree with to run on a target."""

    architecture: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    tokenizer_hash: str | None  # None when no tokenizer was given

    def to_dict(self) -> dict[str, Any]:
        """Plain data for `draftzoo.json`."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TargetFingerprint:
        """Read back `to_dict` output, refusing unknown fields."""
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown target fingerprint fields: {sorted(unknown)}")
        return cls(**data)

    def mismatches(self, other: TargetFingerprint) -> list[str]:
        """Human-readable differences `self` vs `other` (tokenizer skipped when either is None)."""
        diffs = []
        for name in ("architecture", "hidden_size", "num_layers", "vocab_size", "tokenizer_hash"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if name == "tokenizer_hash" and (mine is None or theirs is None):
                continue
            if mine != theirs:
                diffs.append(f"{name}: {mine} != {theirs}")
        return diffs

    def require_match(self, other: TargetFingerprint, what: str = "drafter") -> None:
        """Raise `FingerprintMismatchError` naming both sides when they differ."""
        diffs = self.mismatches(other)
        if diffs:
            raise FingerprintMismatchError(
                f"this {what} was built for another target (expected vs given): " + "; ".join(diffs)
            )


def tokenizer_hash(tokenizer) -> str:
    """A stable hash of a tokenizer's vocabulary and special tokens."""
    payload = {
        "vocab": sorted(tokenizer.get_vocab().items()),
        "special": {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())},
    }
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]


@dataclass
class TargetOutput:
    """One target forward: logits (if asked), the requested hidden states, the cache."""

    logits: torch.Tensor | None  # [batch, seq, vocab]
    hidden_states: dict[int, torch.Tensor]  # HF index -> [batch, seq, hidden]
    cache: Any  # None unless the forward was asked for one (use_cache)


class TargetAdapter(nn.Module):
    """Wraps a transformers causal LM; exposes embeddings, final norm, lm_head, hooks."""

    def __init__(self, model: nn.Module, tokenizer=None) -> None:
        super().__init__()
        output_embeddings = getattr(model, "get_output_embeddings", lambda: None)()
        if output_embeddings is None:
            raise TargetError(
                f"{type(model).__name__} has no causal-LM head (get_output_embeddings() is None); "
                "load the model with AutoModelForCausalLM"
            )
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        layers = getattr(decoder, "layers", None)
        norm = getattr(decoder, "norm", None)
        if layers is None or norm is None:
            raise TargetError(
                f"{type(model).__name__}: expected a decoder with `.layers` and a final `.norm` "
                "(Llama, Qwen2/3, Mistral families)"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.decoder_layers: nn.ModuleList = layers
        self.final_norm: nn.Module = norm

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> TargetAdapter:
        """Load a causal LM and its tokenizer from a folder or hub name."""
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        from .safe_load import load_causal_lm, load_config, load_tokenizer

        config = load_config(path)
        if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            raise TargetError(
                f"{path}: model type {config.model_type!r} has no causal-LM head "
                f"(architectures: {config.architectures})"
            )
        model = load_causal_lm(path, dtype=dtype).to(device).eval()
        return cls(model, load_tokenizer(path))

    @property
    def config(self):
        """The wrapped model's transformers config."""
        return self.model.config

    @property
    def num_layers(self) -> int:
        return len(self.decoder_layers)

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def embed_tokens(self) -> nn.Module:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """What the model does to its head's output before returning logits: Gemma 2/3's
        soft-capping, Granite's division, Cohere's scale (identity for most models). Teachers
        read the target's own distribution through it."""
        return finish_logits(self.model.config, logits)

    def fingerprint(self) -> TargetFingerprint:
        """Architecture, hidden size, layer count, vocab size and tokenizer hash."""
        architectures = self.model.config.architectures or [type(self.model).__name__]
        return TargetFingerprint(
            architecture=architectures[0],
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            vocab_size=self.lm_head.weight.shape[0],
            tokenizer_hash=tokenizer_hash(self.tokenizer) if self.tokenizer is not None else None,
        )

    def check_layer_indices(self, indices: Sequence[int]) -> None:
        """Refuse indices outside 0..N (HF convention)."""
        bad = [i for i in indices if not 0 <= i <= self.num_layers]
        if bad:
            raise TargetError(
                f"hidden-state indices {bad} do not exist: this target has {self.num_layers} "
                f"layers, so valid HF indices are 0..{self.num_layers}"
            )

    @contextmanager
    def capture(self, indices: Sequence[int]):
        """Context that fills a dict {index: hidden state} during forwards inside it."""
        self.check_layer_indices(indices)
        captured: dict[int, torch.Tensor] = {}
        handles = []
        for index in sorted(set(indices)):
            if index == self.num_layers:
                handles.append(
                    self.final_norm.register_forward_hook(_store_output(captured, index))
                )
            else:
                layer = self.decoder_layers[index]
                handles.append(
                    layer.register_forward_pre_hook(_store_input(captured, index), with_kwargs=True)
                )
        try:
            yield captured
        finally:
            for handle in handles:
                handle.remove()

    def forward(
        self,
        input_ids: torch.Tensor,  # [batch, seq]
        hidden_indices: Sequence[int] = (),
        compute_logits: bool = True,
        **model_kwargs: Any,
    ) -> TargetOutput:
        """Run the target, returning logits and the hidden states at `hidden_indices`. A
        prepared 4D `attention_mask` (a packed batch's blocks) is windowed for the model's
        sliding layers (`attention_masks.windowed`), which transformers would not do."""
        if not compute_logits:
            model_kwargs["logits_to_keep"] = 1
        mask = model_kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 4:
            positions = model_kwargs.get("position_ids")
            if positions is None:
                positions = torch.arange(input_ids.shape[1], device=input_ids.device)
                positions = positions.expand(input_ids.shape[0], -1)
            model_kwargs["attention_mask"] = windowed(self.config, mask, positions)
        with self.capture(hidden_indices) as captured:
            out = self.model(input_ids=input_ids, **model_kwargs)
        return TargetOutput(
            logits=out.logits if compute_logits else None,
            hidden_states=dict(captured),
            cache=returned_cache(out),
        )


def finish_logits(config, logits: torch.Tensor) -> torch.Tensor:
    """`logits` (a causal LM's head output) as the model returns them, by the config fields
    transformers' models apply after the head: `final_logit_softcapping` (cap * tanh(z /
    cap)), `logits_scaling` (z / s), `logit_scale` (z * s)."""
    getter = getattr(config, "get_text_config", None)
    config = getter(decoder=True) if getter else config
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    scaling = getattr(config, "logits_scaling", None)
    if scaling not in (None, 1, 1.0):
        logits = logits / scaling
    scale = getattr(config, "logit_scale", None)
    if scale not in (None, 1, 1.0):
        logits = logits * scale
    return logits


@functools.cache
def forward_parameters(module_type: type) -> frozenset[str]:
    """The parameter names of a module class's `forward`."""
    return frozenset(inspect.signature(module_type.forward).parameters)


def cache_parameter(module_type: type) -> str:
    """The name a transformers module's `forward` gives its KV cache: `cache` in newer
    releases, `past_key_values` before."""
    return "cache" if "cache" in forward_parameters(module_type) else "past_key_values"


def returned_cache(out) -> Any:
    """The cache a forward returned: `cache` in newer transformers, `past_key_values` before.

    Read as a mapping: the `past_key_values` attribute of newer outputs warns it is deprecated.
    """
    return out["cache"] if "cache" in out else out.get("past_key_values")


def _store_input(captured: dict[int, torch.Tensor], index: int):
    def hook(module, args, kwargs):
        captured[index] = args[0] if args else kwargs["hidden_states"]

    return hook


def _store_output(captured: dict[int, torch.Tensor], index: int):
    def hook(module, args, output):
        captured[index] = output[0] if isinstance(output, tuple) else output

    return hook
