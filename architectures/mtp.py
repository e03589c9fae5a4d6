"""MTP: DeepSeek-V3 multi-token-prediction modules, drafting from the target's own state.

Module k (0-based, D in all) reads, for position i, the previous depth's state h^k_i (depth 0:
the target's final state *after* its final norm — HF hidden_states[N], what vLLM's DeepSeek
model returns and its MTP layer reads as `previous_hidden_states`, and what transformers'
`MTPCandidateGenerator` takes from `hidden_states[-1]`) and the embedding of token i + k + 1:

    h^{k+1}_i = post_norm(block(eh_proj(cat(enorm(embed(x_{i+k+1})), hnorm(h^k_i)))))

and the target's frozen head reads h^{k+1}_i to predict x_{i+k+2}. That is the `normed`
hand-over (transformers' `MtpLayer`, SGLang's `deepseek_nextn`): the next depth reads the
post-norm state. vLLM's `deepseek_mtp` hands over the block's output *before* post_norm
(post_norm then feeds only the head), zeroes the embedding at position 0 and runs its first
module at every draft step: the `residual` hand-over (`mtp.hand_over`, recorded with the
drafter). The block is one decoder layer of the target's own class built from the target's
config (`transformers.modeling_layers.MtpLayer` wires it, with the target's norm class),
placed at index N + k as a native checkpoint places it (so a DeepSeek target's MTP block is MoE
where its config says so); its rotary embedding is the target's. Modules share no weights.
The embedding and head are the target's, never stored. Module names are transformers'
(`layers.{k}.enorm/hnorm/eh_proj/mtp_block.*/post_norm`); `mtp_native.py` maps the engines'
layouts onto them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .families import FamilySpec
from .target import TargetError, cache_parameter, forward_parameters
from .target_head import TargetHead, check_vocab_map, register_vocab_map

FAMILY = "mtp"
FAMILY_SPECS = (
    FamilySpec(
        name=FAMILY,
        display_name="MTP",
        recipe="draftzoo.train.mtp:MtpRecipe",
        runtime="draftzoo.inference.proposers.mtp:load_runtime",
        exporters={
            "vllm": "draftzoo.architectures.mtp_export:export_vllm",
            "sglang": "draftzoo.architectures.mtp_export:export_sglang",
        },
        tests=(
            "tests/architectures/test_mtp_native.py",
            "tests/train/test_mtp.py",
            "tests/inference/test_mtp_runtime.py",
            "tests/inference/test_mtp_hand_over.py",
        ),
        export_needs_target=True,
        card_notes="draftzoo.architectures.mtp_export:card_notes",
        importers={"speculators": "draftzoo.architectures.mtp_import:import_speculators"},
    ),
)
ARCHITECTURE = "DraftzooMtp"
INIT_FROM = ("scratch", "native")
LOSSES = ("ce", "distill")
#: what module k hands to module k + 1 (and to itself, drafting past its depth): "normed", its
#: post-norm output (transformers' MtpLayer, SGLang's deepseek_nextn); "residual", the block's
#: output before post_norm, with the embedding zeroed at position 0 (vLLM's deepseek_mtp)
HAND_OVERS = ("normed", "residual")


@dataclass(frozen=True)
class MtpConfig:
    """Shape and objective of an MTP drafter (the block's shape is the target's layer)."""

    depth: int = 1  # D sequential modules (DeepSeek-V3 ships 1)
    #: "scratch": new modules (post_norm starts as the target's final norm); "native": the
    #: modules the target's checkpoint ships (DeepSeek-V3, Qwen3-Next or MiMo layout)
    init_from: str = "scratch"
    #: "ce": cross-entropy on the data's next tokens, as DeepSeek-V3 trains; "distill": soft
    #: cross-entropy against the frozen target's distribution at each depth
    loss: str = "ce"
    loss_weight: float = 1.0  # lambda: the loss is (lambda / D) x sum_k L_k
    #: "normed" or "residual" (HAND_OVERS): the engine convention the drafter is trained and
    #: served in; only an engine running the same one drafts what draftzoo measured
    hand_over: str = "normed"
    #: draft over the N most frequent supervised tokens: the target's head truncated at export
    #: (target_head.py; trained over the whole vocabulary); None: the whole vocabulary
    draft_vocab_size: int | None = None

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError("mtp.depth must be >= 1")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"mtp.draft_vocab_size must be >= 1, got {self.draft_vocab_size}")
        if self.init_from not in INIT_FROM:
            raise ValueError(f"mtp.init_from must be one of {INIT_FROM}, got {self.init_from!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"mtp.loss must be one of {LOSSES}, got {self.loss!r}")
        if self.loss_weight <= 0:
            raise ValueError("mtp.loss_weight must be > 0")
        check_hand_over(self.hand_over, self.depth, ValueError)


def check_hand_over(hand_over: str, depth: int, error: type[Exception]) -> None:
    """Refuse an unknown hand-over, and `residual` with more than one module: vLLM, whose
    convention it is, runs the first module at every draft step (its proposer passes no step
    index), so further modules would be trained and never run."""
    if hand_over not in HAND_OVERS:
        raise error(f"mtp.hand_over must be one of {HAND_OVERS}, got {hand_over!r}")
    if hand_over == "residual" and depth > 1:
        raise error(
            "mtp.hand_over: residual is vLLM's deepseek_mtp convention, which runs the first "
            f"module at every draft step; depth {depth} would train modules it never runs "
            "(use depth 1, or hand_over: normed)"
        )


def text_config(target_config):
    """The decoder's own config (multimodal wrappers hold it under text_config)."""
    getter = getattr(target_config, "get_text_config", None)
    return getter(decoder=True) if getter else target_config


def block_config(target_config, depth: int):
    """A copy of the target's text config under which decoder layers N .. N + D - 1 exist
    (extra layer types are full attention), attending with the target's eager attention where
    it has one (Gemma 2's soft-capping, gpt-oss' sinks), else with SDPA; masks are additive
    (`MtpDrafter.module`), which both take."""
    config = copy.deepcopy(text_config(target_config))
    layers = config.num_hidden_layers
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        config.layer_types = [*list(layer_types)[:layers], *["full_attention"] * depth]
    config.num_hidden_layers = layers + depth
    eager = getattr(config, "_attn_implementation", None) == "eager"
    config._attn_implementation = "eager" if eager else "sdpa"
    return config


class MtpDrafter(nn.Module):
    """D MTP modules over a target; `attach_target` shares its embeddings, head and rotary."""

    def __init__(
        self,
        target_config,
        depth: int,
        layer_class: type,
        norm_class: type,
        num_layers: int,
        hand_over: str = "normed",
        draft_vocab_size: int | None = None,
    ) -> None:
        from transformers.modeling_layers import MtpLayer

        super().__init__()
        check_hand_over(hand_over, depth, ValueError)
        self.depth, self.num_target_layers, self.hand_over = depth, num_layers, hand_over
        config = block_config(target_config, depth)
        self.block_config = config
        self.layers = nn.ModuleList(
            MtpLayer(config, layer_class, norm_class, num_layers + k, use_post_norm=True)
            for k in range(depth)
        )
        for k, layer in enumerate(self.layers):
            layer.mtp_block.self_attn.layer_idx = k  # module k is layer k of the drafter's cache
            # residual: the layer returns the block's output; post_norm feeds only the head
            layer.use_post_norm = hand_over == "normed"
        self.fields = {
            "model_type": "mtp",
            "architectures": [ARCHITECTURE],
            "num_nextn_predict_layers": depth,
            "num_target_layers": num_layers,
            "decoder_layer_class": layer_class.__name__,
            "norm_class": norm_class.__name__,
            "hidden_size": config.hidden_size,
            "vocab_size": config.vocab_size,
            "max_position_embeddings": getattr(config, "max_position_embeddings", None),
            "hidden_state_layers": [num_layers],
            "mtp_hand_over": hand_over,
            "target_config": text_config(target_config).to_dict(),
        }
        vocab = config.vocab_size
        if draft_vocab_size is not None and draft_vocab_size < vocab:
            self.fields["draft_vocab_size"] = draft_vocab_size
            register_vocab_map(self, vocab, draft_vocab_size)
        # shared with the target, never saved
        self.embed_tokens: nn.Module | None = None
        self.head: TargetHead | None = None
        self.rotary: nn.Module | None = None
        self._rotary_kind: dict[str, str] = {}

    @property
    def layers_read(self) -> tuple[int, ...]:
        """The target's HF hidden-state index the first module reads (its final, N)."""
        return (self.num_target_layers,)

    def attach_target(self, embed_tokens: nn.Module, lm_head: nn.Module, rotary) -> None:
        """Share the target's embeddings, head and rotary embedding (not submodules). A
        rotary embedding kept per layer type (Gemma 3: local and global) gives the modules
        its full-attention one, their layers' type."""
        object.__setattr__(self, "embed_tokens", embed_tokens)
        object.__setattr__(self, "head", TargetHead(lm_head, getattr(self, "d2t", None)))
        object.__setattr__(self, "rotary", rotary)
        per_type = "layer_type" in forward_parameters(type(rotary))
        self._rotary_kind = {"layer_type": "full_attention"} if per_type else {}

    def drafter_state_dict(self) -> dict[str, torch.Tensor]:
        """The modules' own tensors."""
        return dict(self.state_dict())

    def save_pretrained(
        self, path: Path, safe_serialization: bool = True, state_dict: dict | None = None
    ) -> None:
        """Write config.json (the target's config plus the MTP fields) and model.safetensors."""
        from .drafter_io import write_drafter_files

        tensors = self.drafter_state_dict() if state_dict is None else state_dict
        write_drafter_files(path, self.fields, tensors)

    # -- one module ----------------------------------------------------------------------
    def module(
        self,
        k: int,
        input_ids: torch.Tensor,  # [b, s]: x_{i+k+1} at each position i
        previous: torch.Tensor,  # [b, s, h]: h^k_i
        positions: torch.Tensor,  # [b, s]: rotary positions (i + k)
        #: [b|1, 1, s, kv] bool; None only for one new entry, which sees the whole cache (and
        #: lets attention read grouped keys in place)
        mask: torch.Tensor | None,
        cache=None,  # a transformers DynamicCache (layer k is this module's), or None
    ) -> torch.Tensor:
        """What module k hands over, h^{k+1} [b, s, h]: its post-norm output (`normed`) or the
        block's output before post_norm (`residual`); `logits` reads either."""
        layer = self.layers[k]
        # the module's own dtype: the target's states may be kept narrower (bf16 features),
        # and not every norm widens what it returns (Gemma's and gpt-oss' keep the input's)
        dtype = layer.eh_proj.weight.dtype
        previous = previous.to(dtype)
        embeds = self.embed_tokens(input_ids).to(dtype)
        if self.hand_over == "residual":  # vLLM: "masking inputs at position 0"
            embeds = embeds.masked_fill((positions == 0)[..., None], 0.0)
        rotary = self.rotary(embeds, positions, **self._rotary_kind)
        if mask is not None and mask.dtype == torch.bool:
            blocked = torch.finfo(dtype).min
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
                ~mask, blocked
            )
        return layer(
            embeds,
            previous,
            position_embeddings=rotary,
            attention_mask=mask,
            position_ids=positions,
            use_cache=cache is not None,
            **{cache_parameter(type(layer)): cache},
        )

    def head_states(self, hidden: torch.Tensor, k: int = 0) -> torch.Tensor:
        """What the head reads of module k's hand-over state: the state itself (`normed`) or
        its post_norm (`residual`)."""
        if self.hand_over == "residual":
            return self.layers[k].post_norm(hidden)
        return hidden

    def logits(self, hidden: torch.Tensor, k: int = 0) -> torch.Tensor:
        """The target's head over module k's hand-over states [..., vocab] (-inf off a draft
        vocabulary)."""
        return self.head.logits(self.head_states(hidden, k))

    # -- training forward ----------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,  # [b, s]: the sequence
        states: torch.Tensor,  # [b, s, h]: the target's final post-norm states
        positions: torch.Tensor,  # [b, s]
        allowed: torch.Tensor,  # [b, 1, s, s] bool: causal within each packed sample
        select: list[torch.Tensor],  # per depth, [b, s] bool: positions to return
    ) -> list[torch.Tensor]:
        """Per depth k: the states the head reads [n_k, h] at the selected positions (the loss
        projects them, a chunk of rows at a time). Depth k reads what depth k - 1 hands over
        (training-time unrolling), never the target's."""
        from .eagle import shift

        outputs = []
        previous = states
        for k, keep in enumerate(select):
            previous = self.module(k, shift(input_ids, k + 1), previous, positions + k, allowed)
            outputs.append(self.head_states(previous[keep], k))
        return outputs


def target_classes(target) -> tuple[type, type]:
    """(decoder layer class, norm class) of a `TargetAdapter`'s model, as transformers'
    `MtpModel` infers them (the last layer's class and its first norm's class)."""
    layer = target.decoder_layers[-1]
    norm = getattr(layer, "input_layernorm", None)
    if norm is None:
        raise TargetError(
            f"{type(layer).__name__} has no input_layernorm; MTP modules need a pre-norm "
            "decoder layer"
        )
    return type(layer), type(norm)


def target_rotary(target):
    """The target's rotary embedding module (shared by the MTP blocks)."""
    decoder = target.model.get_decoder()
    rotary = getattr(decoder, "rotary_emb", None)
    if rotary is None:
        raise TargetError(f"{type(decoder).__name__} has no rotary_emb to share with MTP modules")
    return rotary


def build_mtp(config: MtpConfig, target) -> MtpDrafter:
    """Fresh modules for `target` (a `TargetAdapter`); each post_norm starts as the target's
    final norm, so an untrained module's output reads like a target state."""
    layer_class, norm_class = target_classes(target)
    drafter = MtpDrafter(
        target.config, config.depth, layer_class, norm_class, target.num_layers, config.hand_over
    )
    norm_weight = getattr(target.final_norm, "weight", None)
    if norm_weight is not None and norm_weight.device.type != "meta":
        with torch.no_grad():
            for layer in drafter.layers:
                layer.post_norm.weight.copy_(norm_weight.to(layer.post_norm.weight))
    drafter.attach_target(target.embed_tokens, target.lm_head, target_rotary(target))
    return drafter


def load_mtp(
    path: Path,
    target,
    dtype: torch.dtype = torch.float32,
    record: dict | None = None,
    hand_over: str | None = None,
    files=None,
) -> MtpDrafter:
    """A saved MTP drafter, checked against `target` (a `TargetAdapter`) and attached to it.
    `hand_over`: run it in another convention than the one it was trained in (to measure what
    an engine of that convention would draft); None: its own (`normed` when unrecorded)."""
    from .drafter_files import opened
    from .drafter_io import DrafterError, check_drafter_target

    path = Path(path)
    files = opened(path, files)
    record = check_drafter_target(path, target.fingerprint(), record or files.record)
    if record["family"] != FAMILY:
        raise DrafterError(f"{path} holds a {record['family']!r} drafter, not an MTP one")
    fields = files.json()
    layer_class, norm_class = target_classes(target)
    if fields["decoder_layer_class"] != layer_class.__name__:
        raise DrafterError(
            f"{path}: modules built on {fields['decoder_layer_class']}, the target's layers are "
            f"{layer_class.__name__}"
        )
    tensors = files.weights()
    depth = fields["num_nextn_predict_layers"]
    hand_over = hand_over or fields.get("mtp_hand_over", "normed")
    check_hand_over(hand_over, depth, DrafterError)
    draft_vocab = fields.get("draft_vocab_size")
    drafter = MtpDrafter(
        target.config, depth, layer_class, norm_class, target.num_layers, hand_over, draft_vocab
    )
    result = drafter.load_state_dict(tensors, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise DrafterError(
            f"{path}: weights do not match an MTP drafter of depth {drafter.depth} "
            f"(missing {result.missing_keys}, unexpected {result.unexpected_keys})"
        )
    if "d2t" in tensors:
        check_vocab_map(drafter.d2t, drafter.t2d, target.lm_head.weight.shape[0], str(path))
    drafter = drafter.to(dtype=dtype, device=target.lm_head.weight.device).eval()
    drafter.attach_target(target.embed_tokens, target.lm_head, target_rotary(target))
    return drafter
