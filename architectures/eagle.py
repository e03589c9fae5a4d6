"""The EAGLE families: one decoder layer that drafts from the target's own hidden states.

EAGLE-1: x = fc(cat(embed(x_{t+1}), f_t)) (2h -> h; no bias by default, as vLLM loads it),
f = the target's final post-norm state (HF index N); one decoder layer with no input norm; the
target's frozen lm_head reads its output, which also learns to be f_{t+1}.

EAGLE-3: g = fc(cat(target states at three HF indices)) (3h -> h); the layer's attention reads
cat(input_layernorm(embed(x_{t+1})), hidden_norm(g)) (2h) with g as residual; `norm` and an own
`lm_head` over a pruned draft vocabulary (`d2t`: draft id -> target id offset, `t2d`: target
ids in the draft vocabulary). Steps after the first feed the layer's own output back as g.

Module names follow the layout vLLM and SGLang load (`fc`, `midlayer.*`, `norm`, `lm_head`,
`d2t`, `t2d`); the target's embeddings (and EAGLE-1's lm_head) are shared, never stored.
Attention is written here (not taken from transformers) because drafting needs two patterns
no stock layer offers: a cache with rollback plus tree masks at inference, and the
training-time-test pattern (`ttt_attention`) in training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .families import FamilySpec
from .target import TargetError
from .target_head import TargetHead, check_vocab_map, register_vocab_map
from .ttt_attention import flash_ttt_attention

KINDS = ("eagle1", "eagle3")
TOKEN_LOSSES = ("ce", "tvd", "lk")
#: the `architectures` name in draftzoo's own config.json (engine formats come from exporters)
ARCHITECTURES = {"eagle1": "DraftzooEagle1", "eagle3": "DraftzooEagle3"}
_EAGLE = {
    "recipe": "draftzoo.train.eagle:EagleRecipe",
    "runtime": "draftzoo.inference.proposers.eagle:load_runtime",
    "recipes_dir": "",
    "tree_kind": "draftzoo.inference.tree:TreeSettings",
    "teacher_forced": True,
}
FAMILY_SPECS = (
    FamilySpec(
        name="eagle1",
        display_name="EAGLE-1",
        exporters={"vllm": "draftzoo.architectures.eagle_export:export_eagle1"},
        importers={"eagle1": "draftzoo.architectures.eagle_import:import_eagle1"},
        tests=(
            "tests/architectures/test_eagle.py",
            "tests/train/test_eagle.py",
            "tests/inference/test_eagle_runtime.py",
        ),
        **_EAGLE,
    ),
    FamilySpec(
        name="eagle3",
        display_name="EAGLE-3",
        exporters={
            fmt: "draftzoo.architectures.eagle_export:export_eagle3"
            for fmt in ("vllm", "sglang", "speculators")
        }
        | {"gguf": "draftzoo.architectures.eagle_export:export_eagle3_gguf"},
        importers={
            "speculators": "draftzoo.architectures.eagle_import:import_speculators",
            "eagle3": "draftzoo.architectures.eagle_import:import_eagle3",
        },
        tests=(
            "tests/architectures/test_eagle.py",
            "tests/train/test_eagle.py",
            "tests/inference/test_eagle_runtime.py",
            "tests/peers/test_peers.py",
        ),
        export_embedding=True,
        **_EAGLE,
    ),
)


@dataclass(frozen=True)
class EagleConfig:
    """Shape of an EAGLE drafter; unset sizes follow the target."""

    kind: str = "eagle3"  # "eagle1" or "eagle3"
    #: HF hidden-state indices read from the target (index k = input to layer k, N = final
    #: norm output). None: EAGLE-1 reads (N,), EAGLE-3 reads (2, N // 2, N - 3).
    layers: tuple[int, ...] | None = None
    #: the N most frequent supervised tokens; None = the target's whole vocabulary. EAGLE-3
    #: trains its own head over them; EAGLE-1 trains over the target's whole head and drafts
    #: over those rows of it (truncated at export: target_head.py)
    draft_vocab_size: int | None = None
    intermediate_size: int | None = None  # MLP width; None = the target's
    num_attention_heads: int | None = None  # None = the target's
    num_key_value_heads: int | None = None  # None = the target's
    ttt_steps: int = 7  # EAGLE-3 training-time-test unroll length (1 = plain training)
    ttt_decay: float = 0.8  # weight of TTT step j is ttt_decay ** j
    feature_noise: float = 0.0  # uniform noise amplitude added to input features in training
    #: EAGLE-3 only, off as published: weight of an auxiliary loss pulling each TTT step's
    #: output toward the fused target state the next step would read there (both RMS-normalised)
    feature_weight: float = 0.0
    #: EAGLE-3 only, off as published: weight of an auxiliary SmoothL1 between each TTT step's
    #: output read through the target's final norm and the target's final post-norm state whose
    #: logits are that step's target (EAGLE-1's feature target, where the target's head reads
    #: it; the draft head starts as that norm and head)
    final_feature_weight: float = 0.0
    #: the per-token loss against the target: "ce" (soft cross-entropy, as published; EAGLE-3
    #: renormalises the target over the draft vocabulary) or, opt-in, "tvd" (1 - sum over the
    #: draft vocabulary of min(p, q): the chance a token drafted at T = 1 is rejected) or "lk"
    #: (-log of that sum, the acceptance rate: LK losses' LK^alpha, arXiv 2602.23881, whose
    #: gradient is TV's scaled by 1 / alpha)
    token_loss: str = "ce"
    #: a bias on `fc` (EAGLE-1's reference code has one; vLLM's EAGLE-1 loader has none and
    #: would drop it, so the default is off)
    fc_bias: bool = False
    #: the target decoder layer (0-based) the drafter's layer starts from: its MLP, its norms
    #: and its attention's weights on the hidden state (EAGLE-3: the half of q/k/v that reads
    #: the fused state; the half that reads the token's embedding keeps its random start).
    #: None: all random, as published. Negative counts from the last layer (-1: the last).
    init_layer: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"eagle.kind must be one of {KINDS}, got {self.kind!r}")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"eagle.draft_vocab_size must be >= 1, got {self.draft_vocab_size}")
        if self.layers is not None and len(self.layers) != (1 if self.kind == "eagle1" else 3):
            raise ValueError(f"{self.kind} reads {1 if self.kind == 'eagle1' else 3} layer(s)")
        if self.ttt_steps < 1:
            raise ValueError("eagle.ttt_steps must be >= 1")
        if self.kind == "eagle1" and self.ttt_steps != 1:
            raise ValueError("eagle.ttt_steps is EAGLE-3 only; leave it at 1 for EAGLE-1")
        if not 0 < self.ttt_decay <= 1:
            raise ValueError("eagle.ttt_decay must be in (0, 1]")
        if self.feature_noise < 0:
            raise ValueError("eagle.feature_noise must be >= 0")
        if self.feature_weight < 0:
            raise ValueError("eagle.feature_weight must be >= 0")
        if self.final_feature_weight < 0:
            raise ValueError("eagle.final_feature_weight must be >= 0")
        if self.token_loss not in TOKEN_LOSSES:
            raise ValueError(
                f"eagle.token_loss must be one of {TOKEN_LOSSES}, got {self.token_loss!r}"
            )
        if self.kind == "eagle1" and self.feature_weight:
            raise ValueError(
                "eagle.feature_weight is EAGLE-3 only (EAGLE-1 always regresses the next feature)"
            )
        if self.kind == "eagle1" and self.final_feature_weight:
            raise ValueError(
                "eagle.final_feature_weight is EAGLE-3 only "
                "(EAGLE-1 always regresses the next feature)"
            )

    def resolved_layers(self, num_target_layers: int) -> tuple[int, ...]:
        """The HF indices this drafter reads from a target with `num_target_layers` layers."""
        if self.layers is not None:
            return tuple(self.layers)
        n = num_target_layers
        return (n,) if self.kind == "eagle1" else (2, n // 2, n - 3)


def drafter_model_config(config: EagleConfig, target_config, draft_vocab_size: int) -> dict:
    """The drafter's `config.json` fields (Llama names, plus the EAGLE ones)."""
    heads = config.num_attention_heads or target_config.num_attention_heads
    kv_heads = (
        config.num_key_value_heads or getattr(target_config, "num_key_value_heads", None) or heads
    )
    hidden = target_config.hidden_size
    head_dim = getattr(target_config, "head_dim", None) or hidden // heads
    if heads % kv_heads:
        raise TargetError(f"num_attention_heads {heads} is not a multiple of kv heads {kv_heads}")
    rope = getattr(target_config, "rope_parameters", None) or {
        "rope_type": "default",
        "rope_theta": getattr(target_config, "rope_theta", 10000.0),
    }
    return {
        "model_type": "llama",
        "eagle_kind": config.kind,
        "hidden_size": hidden,
        "target_hidden_size": hidden,
        "intermediate_size": config.intermediate_size or target_config.intermediate_size,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "num_hidden_layers": 1,
        "hidden_act": getattr(target_config, "hidden_act", "silu"),
        "rms_norm_eps": getattr(target_config, "rms_norm_eps", 1e-6),
        "max_position_embeddings": target_config.max_position_embeddings,
        "rope_parameters": dict(rope),
        "vocab_size": target_config.vocab_size,
        "draft_vocab_size": draft_vocab_size,
        "num_fused_layers": 1 if config.kind == "eagle1" else 3,
        "fc_bias": config.fc_bias,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }


def _llama_config(fields: dict):
    from transformers import LlamaConfig

    keep = {k: v for k, v in fields.items() if k not in ("model_type",)}
    return LlamaConfig(**keep)


class DraftAttention(nn.Module):
    """Grouped-query attention over `in_features` inputs, returning [b, s, hidden]."""

    def __init__(self, in_features: int, hidden: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(in_features, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(in_features, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(in_features, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [b, heads, s, d]; k, v [b, kv_heads, s, d], rotary applied to q and k."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def expand(self, kv: torch.Tensor) -> torch.Tensor:
        """[b, kv_heads, s, d] -> [b, heads, s, d]."""
        return kv.repeat_interleave(self.heads // self.kv_heads, dim=1)

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        """[b, heads, s, d] -> [b, s, hidden]."""
        b, _, s, _ = attended.shape
        return self.o_proj(attended.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


def attend(q, k, v, mask: torch.Tensor | None) -> torch.Tensor:
    """Plain attention: q [b, H, s, d] over k, v [b, H or kv_heads, S, d] (grouped-query keys
    serve H / kv_heads query heads each, without being copied); `mask` [b|1, 1, s, S] bool, or
    None: every query sees every key."""
    grouped = k.shape[1] != q.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped)


def ttt_attention(
    q: torch.Tensor,  # [b, H, s, d], step j's queries
    keys: list[torch.Tensor],  # [b, H, s, d] per step 0..j
    values: list[torch.Tensor],
    mask0: torch.Tensor,  # [b, 1, s, s] bool: which step-0 keys each position sees
) -> torch.Tensor:
    """Training-time-test attention: step-0 keys under `mask0`, plus, for steps 1..j, only
    the key of the query's own position (the diagonal), as drafting step j would see them.
    On the CPU through its flash kernel (`ttt_attention.py`: the same values and gradients
    without [s, s] scores); elsewhere as written here."""
    if q.device.type == "cpu":
        return flash_ttt_attention(q, keys, values, mask0)
    return eager_ttt_attention(q, keys, values, mask0)


def eager_ttt_attention(q, keys, values, mask0) -> torch.Tensor:
    """`ttt_attention` with its scores and weights held whole ([b, H, s, s + j])."""
    scale = q.shape[-1] ** -0.5
    scores0 = (q @ keys[0].transpose(-1, -2)) * scale
    scores0 = scores0.masked_fill(~mask0, torch.finfo(scores0.dtype).min)
    diagonal = [(q * k).sum(-1, keepdim=True) * scale for k in keys[1:]]
    weights = torch.softmax(torch.cat([scores0, *diagonal], dim=-1).float(), dim=-1).to(q.dtype)
    s = q.shape[2]
    out = weights[..., :s] @ values[0]
    for i, v in enumerate(values[1:]):
        out = out + weights[..., s + i : s + i + 1] * v
    return out


class MidLayer(nn.Module):
    """The drafter's decoder layer (EAGLE-3: 2h attention input; EAGLE-1: no input norm)."""

    def __init__(self, fields: dict) -> None:
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        super().__init__()
        hidden, eps = fields["hidden_size"], fields["rms_norm_eps"]
        self.eagle3 = fields["eagle_kind"] == "eagle3"
        in_features = 2 * hidden if self.eagle3 else hidden
        self.self_attn = DraftAttention(
            in_features,
            hidden,
            fields["num_attention_heads"],
            fields["num_key_value_heads"],
            fields["head_dim"],
        )
        if self.eagle3:
            self.input_layernorm = LlamaRMSNorm(hidden, eps)
            self.hidden_norm = LlamaRMSNorm(hidden, eps)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps)
        self.mlp = LlamaMLP(_llama_config(fields))

    def attention_input(self, embeds: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """What q/k/v read: cat(norm(embed), norm(g)) for EAGLE-3, g itself for EAGLE-1."""
        if self.eagle3:
            return torch.cat([self.input_layernorm(embeds), self.hidden_norm(g)], dim=-1)
        return g

    def finish(self, attended: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """o_proj, residual, post-attention norm, MLP, residual."""
        h = residual + self.self_attn.output(attended)
        return h + self.mlp(self.post_attention_layernorm(h))


class EagleDrafter(nn.Module):
    """An EAGLE-1 or EAGLE-3 drafter; `attach_target` shares the target's embeddings/head."""

    def __init__(self, fields: dict, layers: tuple[int, ...]) -> None:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        super().__init__()
        self.fields, self.layers = dict(fields), tuple(layers)
        self.kind = fields["eagle_kind"]
        hidden = fields["hidden_size"]
        # folders written before `fc_bias` existed had a bias on EAGLE-1 only
        bias = fields.get("fc_bias", self.kind == "eagle1")
        vocab, draft_vocab = fields["vocab_size"], fields["draft_vocab_size"]
        if self.kind == "eagle1":
            self.fc = nn.Linear(2 * hidden, hidden, bias=bias)
            if draft_vocab < vocab:  # the target's head truncated at export (target_head.py)
                register_vocab_map(self, vocab, draft_vocab)
        else:
            self.fc = nn.Linear(3 * hidden, hidden, bias=bias)
            self.norm = LlamaRMSNorm(hidden, fields["rms_norm_eps"])
            self.lm_head = nn.Linear(hidden, draft_vocab, bias=False)
            register_vocab_map(self, vocab, draft_vocab)  # until `set_vocab_map` installs it
        self.midlayer = MidLayer(fields)
        self.rotary = LlamaRotaryEmbedding(_llama_config(fields))
        # shared with the target, excluded from `drafter_state_dict`
        self.embed_tokens: nn.Module | None = None
        self.head: TargetHead | None = None  # EAGLE-1's projection: the target's head

    # -- wiring --------------------------------------------------------------------------
    def attach_target(self, embed_tokens: nn.Module, lm_head: nn.Module) -> None:
        """Share the target's input embeddings (and, for EAGLE-1, its lm_head), frozen."""
        object.__setattr__(self, "embed_tokens", embed_tokens)  # not a submodule: never saved
        object.__setattr__(self, "head", TargetHead(lm_head, getattr(self, "d2t", None)))

    def drafter_state_dict(self) -> dict[str, torch.Tensor]:
        """The drafter's own tensors (no rotary cache, no shared target weights)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("rotary.")}

    def set_vocab_map(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        """Install the pruned vocabulary (EAGLE-3)."""
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def save_pretrained(
        self, path: Path, safe_serialization: bool = True, state_dict: dict | None = None
    ) -> None:
        """Write config.json (Llama names + EAGLE fields) and model.safetensors."""
        from .drafter_io import write_drafter_files

        config = {
            **self.fields,
            "architectures": [ARCHITECTURES[self.kind]],
            "hidden_state_layers": list(self.layers),
            "layer_convention": "hf_hidden_states (index k = input to decoder layer k)",
        }
        tensors = self.drafter_state_dict() if state_dict is None else state_dict
        write_drafter_files(path, config, tensors)

    @property
    def draft_vocab_size(self) -> int:
        return self.fields["draft_vocab_size"]

    # -- pieces of a step ----------------------------------------------------------------
    def fuse(self, states: torch.Tensor) -> torch.Tensor:
        """Target states [b, s, k*h] (layers concatenated in `self.layers` order) -> g [b, s, h]
        (EAGLE-3). EAGLE-1 passes f through unchanged (its fc acts in `step_inputs`)."""
        return self.fc(states) if self.kind == "eagle3" else states

    def step_inputs(
        self, input_ids: torch.Tensor, g: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention input, residual) for tokens [b, s] and features g [b, s, h]."""
        embeds = self.embed_tokens(input_ids).to(g.dtype)
        if self.kind == "eagle1":
            x = self.fc(torch.cat([embeds, g], dim=-1))
            return x, x
        return self.midlayer.attention_input(embeds, g), g

    def rotary_for(self, positions: torch.Tensor, like: torch.Tensor):
        """cos, sin for `positions` [b, s]."""
        return self.rotary(like, positions)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary (EAGLE-1: the target's head, whole or truncated)."""
        if self.kind == "eagle1":
            return self.head.draft_logits(hidden)
        return self.lm_head(self.norm(hidden))

    def proposable_ids(self) -> torch.Tensor:
        """[vocab] bool: the target ids the drafter can propose (its draft vocabulary)."""
        if self.has_vocab_map:
            return self.t2d.bool()
        return torch.ones(self.fields["vocab_size"], dtype=torch.bool, device=self.fc.weight.device)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids."""
        if not self.has_vocab_map:
            return draft_ids
        return draft_ids + self.d2t[draft_ids]

    @property
    def has_vocab_map(self) -> bool:
        """EAGLE-3 always; EAGLE-1 with a draft vocabulary."""
        return getattr(self, "d2t", None) is not None

    # -- training forward: what the recipe calls through its DDP/DeepSpeed wrapper --------
    def forward(
        self,
        input_ids: torch.Tensor,  # [b, s]: the sequence; step j at t reads x_{t+1+j}
        states: torch.Tensor,  # [b, s, k*h]: target states at `self.layers`, concatenated
        positions: torch.Tensor,  # [b, s]
        allowed: torch.Tensor,  # [b, 1, s, s] bool: step-0 attention pattern
        select: list[torch.Tensor],  # per step, [b, s] bool: positions to return
    ) -> list[torch.Tensor]:
        """Per unrolled step j < len(select): the outputs [n_j, h] at the selected positions
        (the loss projects them with `logits`, a chunk of rows at a time)."""
        g0 = self.fuse(states)
        outputs = self.ttt_unroll(input_ids, g0, positions, allowed, len(select))
        return [h[keep] for h, keep in zip(outputs, select, strict=True)]

    def extend(
        self,
        input_ids: torch.Tensor,  # [1, s]
        g: torch.Tensor,  # [1, s, h]
        positions: torch.Tensor,  # [1, s]
        cache: DraftCache,
        mask: torch.Tensor | None,  # [1, 1, s, len(cache) + s] bool; None = see everything
    ) -> torch.Tensor:
        """Append s entries to `cache`, attending under `mask`; the outputs [1, s, h]."""
        x, residual = self.step_inputs(input_ids, g)
        cos, sin = self.rotary_for(positions, x)
        attn = self.midlayer.self_attn
        q, k, v = attn.project(x, cos, sin)
        cache.append(k, v)
        attended = attend(q, cache.keys, cache.values, mask)
        return self.midlayer.finish(attended, residual)

    def ttt_unroll(
        self,
        input_ids: torch.Tensor,  # [b, s]: the sequence; step j at t reads x_{t+1+j}
        g0: torch.Tensor,  # [b, s, h]: fused target states (EAGLE-1: f)
        positions: torch.Tensor,  # [b, s]
        allowed: torch.Tensor,  # [b, 1, s, s] bool: step-0 attention pattern
        steps: int,
    ) -> list[torch.Tensor]:
        """Outputs [b, s, h] of training-time-test steps 0..steps-1 (step j's output at t is
        what drafting j + 1 tokens ahead from position t computes)."""
        attn = self.midlayer.self_attn
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        outputs = []
        g = g0
        for j in range(steps):
            ids = shift(input_ids, 1 + j)
            x, residual = self.step_inputs(ids, g)
            cos, sin = self.rotary_for(positions + j, x)
            q, k, v = attn.project(x, cos, sin)
            keys.append(attn.expand(k))
            values.append(attn.expand(v))
            if j == 0:
                attended = attend(q, keys[0], values[0], allowed)
            else:
                attended = ttt_attention(q, keys, values, allowed)
            g = self.midlayer.finish(attended, residual)
            outputs.append(g)
        return outputs


def shift(t: torch.Tensor, by: int, fill=0) -> torch.Tensor:
    """t[:, by:] right-padded with `fill` back to t's length (dim 1)."""
    if by == 0:
        return t
    return torch.cat([t[:, by:], torch.full_like(t[:, :by], fill)], dim=1)


class DraftCache:
    """The drafter's key/value cache, [1, kv_heads, length, d], with rollback by cropping.

    Entries live in buffers grown `GROW` positions at a time, so appending a drafted token
    writes one slot instead of copying the whole cache, and cropping only moves `length`."""

    GROW = 256

    def __init__(self) -> None:
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self.length = 0

    def __len__(self) -> int:
        return self.length

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[:, :, : self.length]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        end = self.length + k.shape[2]
        if self._keys is None or end > self._keys.shape[2]:
            self._reserve(k, v, end)
        self._keys[:, :, self.length : end] = k
        self._values[:, :, self.length : end] = v
        self.length = end

    def _reserve(self, k: torch.Tensor, v: torch.Tensor, needed: int) -> None:
        size = -(-needed // self.GROW) * self.GROW
        keys = k.new_empty(*k.shape[:2], size, k.shape[3])
        values = v.new_empty(*v.shape[:2], size, v.shape[3])
        if self.length:
            keys[:, :, : self.length] = self.keys
            values[:, :, : self.length] = self.values
        self._keys, self._values = keys, values

    def nbytes(self) -> int:
        """Bytes of the buffers the keys and values live in."""
        if self._keys is None:
            return 0
        return 2 * self._keys.numel() * self._keys.element_size()

    def crop(self, length: int) -> None:
        """Keep the first `length` entries."""
        self.length = min(self.length, length)


def build_eagle(config: EagleConfig, target, draft_vocab_size: int | None = None) -> EagleDrafter:
    """A fresh drafter for `target` (a `TargetAdapter`), checked against it at build time.

    The layers must exist in the target. EAGLE-3's head is started from the target's by
    `init_draft_head` once `set_vocab_map` has installed the draft vocabulary. EAGLE-1 trains
    over the target's whole head (its draft vocabulary is installed at export).
    """
    layers = config.resolved_layers(target.num_layers)
    target.check_layer_indices(layers)
    vocab = target.lm_head.weight.shape[0]
    wanted = config.draft_vocab_size if config.kind == "eagle3" else None
    size = draft_vocab_size or wanted or vocab
    if size > vocab:
        raise TargetError(f"draft_vocab_size {size} exceeds the target's vocabulary {vocab}")
    fields = drafter_model_config(config, target.config, size)
    drafter = EagleDrafter(fields, layers)
    drafter.attach_target(target.embed_tokens, target.lm_head)
    return drafter


def init_draft_head(drafter: EagleDrafter, target) -> None:
    """EAGLE-3: start `norm` and `lm_head` as the target's head on the draft vocabulary.

    `target` is a `TargetAdapter`. The final norm's weight is copied with the lm_head rows, so
    the untrained head gives the target's logits over the draft vocabulary for any state.
    """
    if drafter.kind != "eagle3":
        return
    ids = torch.nonzero(drafter.t2d, as_tuple=True)[0]
    norm_weight = getattr(target.final_norm, "weight", None)
    if norm_weight is None or norm_weight.shape != drafter.norm.weight.shape:
        raise TargetError(
            f"{type(target.final_norm).__name__}: the target's final norm has no weight of shape "
            f"{tuple(drafter.norm.weight.shape)} to start the draft head from"
        )
    with torch.no_grad():
        drafter.lm_head.weight.copy_(target.lm_head.weight[ids].to(drafter.lm_head.weight))
        drafter.norm.weight.copy_(norm_weight.to(drafter.norm.weight))


def init_layer_from_target(drafter: EagleDrafter, target, index: int) -> None:
    """Start the drafter's decoder layer from the target's layer `index` (`init_layer`), where
    the shapes agree; a target whose layer does not have them is refused in one line."""
    layers = target.decoder_layers
    if not -len(layers) <= index < len(layers):
        raise TargetError(f"eagle.init_layer {index}: the target has {len(layers)} layers")
    source, mine = layers[index], drafter.midlayer
    attention, theirs = mine.self_attn, getattr(source, "self_attn", None)
    hidden = drafter.fields["hidden_size"]
    pairs = [
        (mine.mlp, getattr(source, "mlp", None)),
        (mine.post_attention_layernorm, getattr(source, "post_attention_layernorm", None)),
        (attention.o_proj, getattr(theirs, "o_proj", None)),
    ]
    norm = mine.hidden_norm if drafter.kind == "eagle3" else None
    if norm is not None:
        pairs.append((norm, getattr(source, "input_layernorm", None)))
    with torch.no_grad():
        for own, their in pairs:
            _copy_module(own, their, index)
        for name in ("q_proj", "k_proj", "v_proj"):
            weight = getattr(attention, name).weight
            their = getattr(getattr(theirs, name, None), "weight", None)
            reads = weight[:, -hidden:]  # EAGLE-3: the fused state's half; EAGLE-1: all of it
            if their is None or their.shape != reads.shape:
                raise TargetError(
                    f"eagle.init_layer {index}: the target layer's {name} is not "
                    f"{tuple(reads.shape)}; leave init_layer unset for this target"
                )
            reads.copy_(their.to(weight))


def _copy_module(own: nn.Module, their: nn.Module | None, index: int) -> None:
    """Every parameter of `own` from the same name in `their`, shapes equal."""
    mine = dict(own.named_parameters())
    theirs = dict(their.named_parameters()) if their is not None else {}
    if set(mine) != set(theirs) or any(mine[k].shape != theirs[k].shape for k in mine):
        raise TargetError(
            f"eagle.init_layer {index}: the target layer has no {type(own).__name__} of the "
            "drafter's shape; leave init_layer unset for this target"
        )
    for name, parameter in mine.items():
        parameter.copy_(theirs[name].to(parameter))


def load_eagle(
    path: Path,
    target,
    dtype: torch.dtype = torch.float32,
    record: dict | None = None,
    files=None,
) -> EagleDrafter:
    """A saved EAGLE drafter, checked against `target` (a `TargetAdapter`) and attached to it.

    Refuses another target (fingerprint), missing layers, and any missing or unexpected weight.
    """
    from .drafter_files import opened
    from .drafter_io import DrafterError, check_drafter_target

    path = Path(path)
    files = opened(path, files)
    record = check_drafter_target(path, target.fingerprint(), record or files.record)
    if record["family"] not in KINDS:
        raise DrafterError(f"{path} holds a {record['family']!r} drafter, not an EAGLE one")
    fields = files.json()
    layers = tuple(fields["hidden_state_layers"])
    target.check_layer_indices(layers)
    tensors = files.weights()
    drafter = EagleDrafter(fields, layers)
    result = drafter.load_state_dict(tensors, strict=False)
    missing = [k for k in result.missing_keys if not k.startswith("rotary.")]
    if missing or result.unexpected_keys:
        raise DrafterError(
            f"{path}: weights do not match an {fields['eagle_kind']} drafter "
            f"(missing {missing}, unexpected {result.unexpected_keys})"
        )
    if drafter.has_vocab_map:
        check_vocab_map(drafter.d2t, drafter.t2d, target.lm_head.weight.shape[0], str(path))
    drafter = drafter.to(dtype=dtype, device=target.lm_head.weight.device).eval()
    drafter.attach_target(target.embed_tokens, target.lm_head)
    return drafter
