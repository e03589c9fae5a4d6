"""DFlash: a few non-causal layers that draft a whole block in one forward (arXiv 2602.06036).

The target's states at several layers (HF indices `taps`) are fused into a context,
`c = hidden_norm(fc(cat(states)))` (k*h -> h), one entry per committed position. A block is the
last verified token (the anchor, at position a) followed by `block_size - 1` mask tokens at
a + 1 .. a + block_size - 1. Each layer (Qwen3-style: q/k per-head RMSNorm, no bias) reads the
block through its input norm; its keys and values are the context's (through the same k/v
projections, without the input norm) followed by the block's own, and every block position sees
all context entries before the anchor and the whole block (no causal mask inside it). The
final norm's output at slot i >= 1 predicts the token at a + i through the target's own head;
the target's embedding and head are shared, never stored.

Module names are those of z-lab/dflash's `DFlashDraftModel`, the layout vLLM and SGLang load as
`dflash` (`layers.{i}.self_attn.{q,k,v,o}_proj/q_norm/k_norm`, `layers.{i}.mlp.*`,
`layers.{i}.input_layernorm/post_attention_layernorm`, `fc`, `hidden_norm`, `norm`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .families import FamilySpec
from .target import TargetError
from .target_head import TargetHead, check_vocab_map, register_vocab_map

FAMILY = "dflash"
ARCHITECTURE = "DraftzooDflash"
TOKEN_LOSSES = ("ce", "hard")
FAMILY_SPECS = (
    FamilySpec(
        name=FAMILY,
        display_name="DFlash",
        recipe="draftzoo.train.dflash:DflashRecipe",
        runtime="draftzoo.inference.proposers.dflash:load_runtime",
        exporters={
            "vllm": "draftzoo.architectures.dflash_export:export_engines",
            "sglang": "draftzoo.architectures.dflash_export:export_engines",
            "speculators": "draftzoo.architectures.dflash_export:export_speculators",
            "gguf": "draftzoo.architectures.dflash_export:export_gguf",
        },
        importers={
            "engines": "draftzoo.architectures.dflash_import:import_engines",
            "speculators": "draftzoo.architectures.dflash_import:import_speculators",
        },
        tests=(
            "tests/architectures/test_dflash.py",
            "tests/train/test_dflash.py",
            "tests/inference/test_dflash_runtime.py",
        ),
        tree_kind="draftzoo.inference.proposers.position_tree:PositionTree",
    ),
)


def reference_taps(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """The reference's default taps, as HF hidden-state indices: one per draft layer, evenly
    spaced from after layer 1 to after layer N - 3 (the middle layer for one draft layer)."""
    if num_draft_layers == 1:
        return (num_target_layers // 2 + 1,)
    start, end = 1, num_target_layers - 3
    step = (end - start) / (num_draft_layers - 1)
    return tuple(round(start + i * step) + 1 for i in range(num_draft_layers))


@dataclass(frozen=True)
class DflashConfig:
    """Shape and objective of a DFlash drafter; unset sizes follow the target."""

    block_size: int = 8  # anchor + block_size - 1 drafted tokens (the reference ships 16)
    num_layers: int = 1  # draft decoder layers
    #: HF hidden-state indices fused into the context (index k = input to target layer k);
    #: None: the reference's spacing, one tap per draft layer
    layers: tuple[int, ...] | None = None
    #: the token id the block's drafted slots read; None: the tokenizer's mask token
    mask_token_id: int | None = None
    intermediate_size: int | None = None  # MLP width; None = the target's
    num_attention_heads: int | None = None  # None = the target's
    num_key_value_heads: int | None = None  # None = the target's
    anchors_per_row: int = 32  # training: blocks drawn per packed row
    #: training: slot i (1-based) weighs exp(-(i - 1) / loss_decay); 0 = every slot alike
    loss_decay: float = 4.0
    #: "ce": soft cross-entropy against the target's distribution at each slot; "hard":
    #: cross-entropy on the data's tokens (the reference trains on target-written data so)
    token_loss: str = "ce"
    #: draft over the N most frequent supervised tokens: the target's head truncated at export
    #: (target_head.py; trained over the whole vocabulary); None: the whole vocabulary
    draft_vocab_size: int | None = None

    def __post_init__(self) -> None:
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"dflash.draft_vocab_size must be >= 1, got {self.draft_vocab_size}")
        if self.block_size < 2:
            raise ValueError("dflash.block_size must be >= 2 (the anchor and one drafted token)")
        if self.num_layers < 1:
            raise ValueError("dflash.num_layers must be >= 1")
        if self.layers is not None and not self.layers:
            raise ValueError("dflash.layers must name at least one target layer (or be null)")
        if self.anchors_per_row < 1:
            raise ValueError("dflash.anchors_per_row must be >= 1")
        if self.loss_decay < 0:
            raise ValueError("dflash.loss_decay must be >= 0")
        if self.token_loss not in TOKEN_LOSSES:
            raise ValueError(
                f"dflash.token_loss must be one of {TOKEN_LOSSES}, got {self.token_loss!r}"
            )
        if self.mask_token_id is not None and self.mask_token_id < 0:
            raise ValueError("dflash.mask_token_id must be >= 0")

    def resolved_layers(self, num_target_layers: int) -> tuple[int, ...]:
        """The HF indices this drafter fuses from a target with `num_target_layers` layers."""
        if self.layers is not None:
            return tuple(self.layers)
        return reference_taps(num_target_layers, self.num_layers)

    def slot_weights(self) -> torch.Tensor:
        """[block_size - 1] loss weight of drafted slots 1 .. block_size - 1."""
        slots = torch.arange(self.block_size - 1, dtype=torch.float32)
        if self.loss_decay == 0:
            return torch.ones_like(slots)
        return torch.exp(-slots / self.loss_decay)


def resolve_mask_token(config: DflashConfig, tokenizer) -> int:
    """The mask token id: the config's, or the tokenizer's mask token; neither is an error."""
    if config.mask_token_id is not None:
        return config.mask_token_id
    mask = getattr(tokenizer, "mask_token_id", None) if tokenizer is not None else None
    if mask is None:
        raise TargetError(
            "the target's tokenizer has no mask token: set dflash.mask_token_id to the id the "
            "drafted slots read (any id works; the drafter learns its embedding's role)"
        )
    return int(mask)


def drafter_model_config(
    config: DflashConfig, target_config, taps: tuple[int, ...], mask_token_id: int
) -> dict:
    """The drafter's `config.json` fields (Qwen3 names, plus DFlash's own)."""
    heads = config.num_attention_heads or target_config.num_attention_heads
    kv_heads = (
        config.num_key_value_heads or getattr(target_config, "num_key_value_heads", None) or heads
    )
    hidden = target_config.hidden_size
    if heads % kv_heads:
        raise TargetError(f"num_attention_heads {heads} is not a multiple of kv heads {kv_heads}")
    rope = getattr(target_config, "rope_parameters", None) or {
        "rope_type": "default",
        "rope_theta": getattr(target_config, "rope_theta", 10000.0),
    }
    return {
        "model_type": "qwen3",
        "hidden_size": hidden,
        "target_hidden_size": hidden,
        "intermediate_size": config.intermediate_size or target_config.intermediate_size,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": getattr(target_config, "head_dim", None) or hidden // heads,
        "num_hidden_layers": config.num_layers,
        "num_target_layers": target_config.num_hidden_layers,
        "hidden_act": getattr(target_config, "hidden_act", "silu"),
        "rms_norm_eps": getattr(target_config, "rms_norm_eps", 1e-6),
        "max_position_embeddings": target_config.max_position_embeddings,
        "rope_parameters": dict(rope),
        "vocab_size": target_config.vocab_size,
        "block_size": config.block_size,
        "mask_token_id": mask_token_id,
        "hidden_state_layers": list(taps),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }


def _llama_config(fields: dict):
    """A LlamaConfig with the drafter's shape (for transformers' MLP, norm and rotary)."""
    from transformers import LlamaConfig

    keys = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_act",
        "rms_norm_eps",
        "max_position_embeddings",
        "rope_parameters",
        "vocab_size",
        "mlp_bias",
    )
    return LlamaConfig(**{k: fields[k] for k in keys})


class DflashAttention(nn.Module):
    """Grouped-query attention with per-head RMSNorm on queries and keys (Qwen3)."""

    def __init__(self, fields: dict) -> None:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        super().__init__()
        hidden, eps = fields["hidden_size"], fields["rms_norm_eps"]
        self.heads, self.kv_heads = fields["num_attention_heads"], fields["num_key_value_heads"]
        self.head_dim = fields["head_dim"]
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.q_norm = LlamaRMSNorm(self.head_dim, eps)
        self.k_norm = LlamaRMSNorm(self.head_dim, eps)

    def _heads(self, x: torch.Tensor, count: int) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, count, self.head_dim)

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """q [b, heads, s, d], normed per head, rotary applied."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        q = self.q_norm(self._heads(self.q_proj(x), self.heads)).transpose(1, 2)
        return apply_rotary_pos_emb(q, q, cos, sin)[0]

    def keys_values(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [b, kv_heads, s, d]: keys normed per head with rotary, values as projected."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        k = self.k_norm(self._heads(self.k_proj(x), self.kv_heads)).transpose(1, 2)
        v = self._heads(self.v_proj(x), self.kv_heads).transpose(1, 2)
        return apply_rotary_pos_emb(k, k, cos, sin)[0], v

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        """[b, heads, s, d] -> [b, s, hidden]."""
        b, _, s, _ = attended.shape
        return self.o_proj(attended.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class DflashLayer(nn.Module):
    """One draft decoder layer: the block attends to the context's entries and to itself."""

    def __init__(self, fields: dict) -> None:
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        super().__init__()
        hidden, eps = fields["hidden_size"], fields["rms_norm_eps"]
        self.self_attn = DflashAttention(fields)
        self.mlp = LlamaMLP(_llama_config(fields))
        self.input_layernorm = LlamaRMSNorm(hidden, eps)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps)

    def forward(
        self,
        x: torch.Tensor,  # [b, m, h]: the block's states
        cos: torch.Tensor,  # rotary at the block's positions
        sin: torch.Tensor,
        keys: torch.Tensor,  # [b, kv_heads, n, d]: context entries (`DflashDrafter.entries`)
        values: torch.Tensor,
        mask: torch.Tensor | None,  # [b|1, 1, m, n + m] bool; None: every key is seen
    ) -> torch.Tensor:
        from .eagle import attend

        attn = self.self_attn
        normed = self.input_layernorm(x)
        q = attn.queries(normed, cos, sin)
        k, v = attn.keys_values(normed, cos, sin)
        attended = attend(q, torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2), mask)
        x = x + attn.output(attended)
        return x + self.mlp(self.post_attention_layernorm(x))


class DflashDrafter(nn.Module):
    """A DFlash drafter; `attach_target` shares the target's embeddings and head."""

    def __init__(self, fields: dict) -> None:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        super().__init__()
        self.fields = dict(fields)
        self.taps = tuple(fields["hidden_state_layers"])
        self.block_size, self.mask_token_id = fields["block_size"], fields["mask_token_id"]
        hidden, eps = fields["hidden_size"], fields["rms_norm_eps"]
        self.layers = nn.ModuleList(DflashLayer(fields) for _ in range(fields["num_hidden_layers"]))
        self.fc = nn.Linear(len(self.taps) * fields["target_hidden_size"], hidden, bias=False)
        self.hidden_norm = LlamaRMSNorm(hidden, eps)
        self.norm = LlamaRMSNorm(hidden, eps)
        self.rotary = LlamaRotaryEmbedding(_llama_config(fields))
        vocab, draft_vocab = fields["vocab_size"], fields.get("draft_vocab_size")
        if draft_vocab is not None and draft_vocab < vocab:
            register_vocab_map(self, vocab, draft_vocab)
        self.embed_tokens: nn.Module | None = None  # shared with the target, never saved
        self.head: TargetHead | None = None

    @property
    def layers_read(self) -> tuple[int, ...]:
        """The target's HF hidden-state indices the context fuses."""
        return self.taps

    def attach_target(self, embed_tokens: nn.Module, lm_head: nn.Module) -> None:
        """Share the target's input embeddings and head, frozen (not submodules)."""
        object.__setattr__(self, "embed_tokens", embed_tokens)
        object.__setattr__(self, "head", TargetHead(lm_head, getattr(self, "d2t", None)))

    def drafter_state_dict(self) -> dict[str, torch.Tensor]:
        """The drafter's own tensors (no rotary cache, no shared target weights)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("rotary.")}

    def save_pretrained(
        self, path: Path, safe_serialization: bool = True, state_dict: dict | None = None
    ) -> None:
        """Write config.json (Qwen3 names + DFlash fields) and model.safetensors."""
        from .drafter_io import write_drafter_files

        config = {
            **self.fields,
            "architectures": [ARCHITECTURE],
            "layer_convention": "hf_hidden_states (index k = input to decoder layer k)",
        }
        tensors = self.drafter_state_dict() if state_dict is None else state_dict
        write_drafter_files(path, config, tensors)

    # -- pieces ----------------------------------------------------------------------------
    def context(self, states: torch.Tensor) -> torch.Tensor:
        """Target states [b, n, k*h] (taps concatenated in order) -> context [b, n, h]."""
        return self.hidden_norm(self.fc(states.to(self.fc.weight.dtype)))

    def entries(
        self, context: torch.Tensor, positions: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys and values [b, kv_heads, n, d] of context [b, n, h] at
        `positions` [b, n]."""
        cos, sin = self.rotary(context, positions)
        return [layer.self_attn.keys_values(context, cos, sin) for layer in self.layers]

    def block_inputs(self, anchors: torch.Tensor) -> torch.Tensor:
        """Block token ids [..., block_size]: each anchor token followed by mask tokens."""
        masks = anchors.new_full((*anchors.shape, self.block_size - 1), self.mask_token_id)
        return torch.cat([anchors[..., None], masks], dim=-1)

    def run_block(
        self,
        ids: torch.Tensor,  # [b, m]: blocks, each an anchor and its mask tokens
        positions: torch.Tensor,  # [b, m]
        entries: list[tuple[torch.Tensor, torch.Tensor]],  # per layer, [b, kv_heads, n, d]
        mask: torch.Tensor | None,  # [b|1, 1, m, n + m] bool; None: every key is seen
    ) -> torch.Tensor:
        """The final norm's output [b, m, h] at every block slot."""
        x = self.embed_tokens(ids).to(self.fc.weight.dtype)
        cos, sin = self.rotary(x, positions)
        for layer, (keys, values) in zip(self.layers, entries, strict=True):
            x = layer(x, cos, sin, keys, values, mask)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's head over block outputs [..., vocab] (-inf off a draft vocabulary)."""
        return self.head.logits(hidden)

    # -- training forward: what the recipe calls through its DDP/DeepSpeed wrapper ----------
    def forward(
        self,
        states: torch.Tensor,  # [b, s, k*h]: target states at the taps, concatenated
        positions: torch.Tensor,  # [b, s]: the rows' positions
        ids: torch.Tensor,  # [b, m]: every block of the row, one after another
        block_positions: torch.Tensor,  # [b, m]
        mask: torch.Tensor,  # [b, 1, m, s + m] bool: what each block slot sees
    ) -> torch.Tensor:
        """Block outputs [b, m, h] of all blocks of the rows in one forward."""
        entries = self.entries(self.context(states), positions)
        return self.run_block(ids, block_positions, entries, mask)


def build_dflash(config: DflashConfig, target) -> DflashDrafter:
    """A fresh drafter for `target` (a `TargetAdapter`), checked against it at build time."""
    taps = config.resolved_layers(target.num_layers)
    target.check_layer_indices(taps)
    mask = resolve_mask_token(config, target.tokenizer)
    vocab = target.lm_head.weight.shape[0]
    if mask >= vocab:
        raise TargetError(f"dflash.mask_token_id {mask} is outside the vocabulary ({vocab})")
    drafter = DflashDrafter(drafter_model_config(config, target.config, taps, mask))
    drafter.attach_target(target.embed_tokens, target.lm_head)
    return drafter


def load_dflash(
    path: Path,
    target,
    dtype: torch.dtype = torch.float32,
    record: dict | None = None,
    files=None,
) -> DflashDrafter:
    """A saved DFlash drafter, checked against `target` (a `TargetAdapter`) and attached."""
    from .drafter_files import opened
    from .drafter_io import DrafterError, check_drafter_target

    path = Path(path)
    files = opened(path, files)
    record = check_drafter_target(path, target.fingerprint(), record or files.record)
    if record["family"] != FAMILY:
        raise DrafterError(f"{path} holds a {record['family']!r} drafter, not a DFlash one")
    fields = files.json()
    target.check_layer_indices(fields["hidden_state_layers"])
    drafter = DflashDrafter(fields)
    tensors = files.weights()
    result = drafter.load_state_dict(tensors, strict=False)
    missing = [k for k in result.missing_keys if not k.startswith("rotary.")]
    if missing or result.unexpected_keys:
        raise DrafterError(
            f"{path}: weights do not match a DFlash drafter of {len(drafter.layers)} layer(s) "
            f"(missing {missing}, unexpected {result.unexpected_keys})"
        )
    if "d2t" in tensors:
        check_vocab_map(drafter.d2t, drafter.t2d, target.lm_head.weight.shape[0], str(path))
    drafter = drafter.to(dtype=dtype, device=target.lm_head.weight.device).eval()
    drafter.attach_target(target.embed_tokens, target.lm_head)
    return drafter
