"""Medusa heads: K extra decoding heads on the target's final post-norm state.

Head k (k = 1..K) at position t predicts token t + k + 1 (the target's own head predicts
t + 1). Each head is its own stack of `num_layers` residual blocks x + SiLU(W x + b), W
zero-initialised so an untrained block is the identity, followed by its own Linear(h, V)
started from the target's lm_head. Unlike the reference code's `[ResBlock] * n`, which repeats
one block object (shared weights), every block here holds its own weights.

Parameter names are vLLM's (`blocks.{h}.layers.{l}.weight/bias`, `lm_heads.{h}.weight`), so
the vLLM export is a rename-free copy. With `draft_vocab_size` set, each projection covers only
the most frequent supervised tokens (vLLM's `truncated_vocab_size`): `token_map` [draft vocab]
holds their target ids in ascending order, and every other token's logit is -inf.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .drafter_io import DrafterError
from .families import FamilySpec
from .target import TargetError

#: Medusa-1: heads on the frozen target; Medusa-2: heads trained with a LoRA on the target
FAMILIES = ("medusa1", "medusa2")
_MEDUSA = {
    "runtime": "draftzoo.inference.proposers.medusa:load_runtime",
    "exporters": {
        "vllm": "draftzoo.architectures.medusa_export:export_vllm",
        "medusa": "draftzoo.architectures.medusa_export:export_reference",
    },
    "tree_kind": "draftzoo.inference.proposers.position_tree:PositionTree",
}
FAMILY_SPECS = (
    FamilySpec(
        name="medusa1",
        display_name="Medusa-1",
        recipe="draftzoo.train.medusa:MedusaRecipe",
        tests=(
            "tests/architectures/test_medusa.py",
            "tests/train/test_medusa.py",
            "tests/inference/test_medusa_runtime.py",
        ),
        importers={
            "vllm": "draftzoo.architectures.medusa_import:import_vllm",
            "medusa": "draftzoo.architectures.medusa_import:import_reference",
        },
        **_MEDUSA,
    ),
    FamilySpec(
        name="medusa2",
        display_name="Medusa-2",
        recipe="draftzoo.train.medusa2:Medusa2Recipe",
        tests=("tests/train/test_medusa2.py", "tests/inference/test_medusa2_runtime.py"),
        adapts_target=True,
        export_needs_target=True,
        **_MEDUSA,
    ),
)


@dataclass(frozen=True)
class MedusaConfig:
    """The heads' shape."""

    num_heads: int = 4  # K: head k predicts the token k + 1 places after the next one
    num_layers: int = 1  # residual blocks per head
    draft_vocab_size: int | None = None  # heads over the N most frequent tokens; None: all

    def __post_init__(self) -> None:
        if self.num_heads < 1 or self.num_layers < 1:
            raise ValueError("medusa.num_heads and medusa.num_layers must be >= 1")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"medusa.draft_vocab_size must be >= 1, got {self.draft_vocab_size}")


class ResidualBlocks(nn.Module):
    """`num_layers` blocks x <- x + SiLU(W x + b), each with its own W (zero at start)."""

    def __init__(self, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_layers))
        for layer in self.layers:
            nn.init.zeros_(layer.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + self.act(layer(x))
        return x


class MedusaHeads(nn.Module):
    """K heads over the target's final post-norm state [..., h] -> logits [K, ..., V]."""

    def __init__(self, fields: dict) -> None:
        super().__init__()
        self.fields = dict(fields)
        hidden, vocab = fields["hidden_size"], fields["vocab_size"]
        heads, layers = fields["medusa_num_heads"], fields["medusa_num_layers"]
        self.vocab_size = vocab
        self.draft_vocab_size = fields.get("truncated_vocab_size", vocab)
        if not 1 <= self.draft_vocab_size <= vocab:
            raise DrafterError(
                f"truncated_vocab_size {self.draft_vocab_size} is not in 1..{vocab} (vocab_size)"
            )
        self.blocks = nn.ModuleList(ResidualBlocks(hidden, layers) for _ in range(heads))
        self.lm_heads = nn.ModuleList(
            nn.Linear(hidden, self.draft_vocab_size, bias=False) for _ in range(heads)
        )
        # ascending target ids (the real map comes from the data); None: the whole vocabulary
        truncated = self.draft_vocab_size < vocab
        token_map = torch.arange(self.draft_vocab_size) if truncated else None
        self.register_buffer("token_map", token_map)

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def set_token_map(self, token_map: torch.Tensor) -> None:
        """Install the draft vocabulary: `draft_vocab_size` distinct ascending target ids."""
        ids = token_map.to(torch.long)
        if self.token_map is None or ids.shape != self.token_map.shape:
            raise ValueError(f"a token map of {self.draft_vocab_size} ids is wanted")
        if not bool((ids[1:] > ids[:-1]).all()) or int(ids[0]) < 0 or ids[-1] >= self.vocab_size:
            raise ValueError("a token map holds distinct ascending ids of the target's vocabulary")
        with torch.no_grad():
            self.token_map.copy_(ids)

    def forward(
        self, hidden: torch.Tensor | list[torch.Tensor], heads: int | None = None
    ) -> torch.Tensor | list[torch.Tensor]:
        """Logits [heads, ..., V] of the first `heads` heads (all by default) on one state
        tensor [..., h]; or, given a list of K tensors (training: each head's own positions),
        each head's states [n, h] before its vocabulary projection (`project`, which the loss
        runs a chunk of rows at a time)."""
        if isinstance(hidden, (list, tuple)):
            return [self.head_states(k, states) for k, states in enumerate(hidden)]
        count = self.num_heads if heads is None else heads
        return torch.stack([self.head_logits(k, hidden) for k in range(count)])

    def head_states(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """Head k's block output [..., h] (what its projection reads)."""
        return self.blocks[k](hidden.to(self.lm_heads[k].weight.dtype))

    def project(self, k: int, states: torch.Tensor) -> torch.Tensor:
        """Head k's logits [..., V'] over its draft vocabulary from its block output."""
        return self.lm_heads[k](states)

    def draft_logits(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [..., V'] of head k over its draft vocabulary (0-based: head 0 predicts two
        tokens ahead)."""
        return self.project(k, self.head_states(k, hidden))

    def head_logits(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [..., V] of head k over the target's vocabulary (-inf off the draft one)."""
        return self.to_vocab(self.draft_logits(k, hidden))

    def to_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., V'] placed in the target's vocabulary [..., V]."""
        if self.token_map is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.token_map] = logits
        return full

    def draft_ids(self) -> torch.Tensor | None:
        """[V] each target id's draft id, -1 off the draft vocabulary (None: not truncated)."""
        if self.token_map is None:
            return None
        ids = torch.full((self.vocab_size,), -1, dtype=torch.long, device=self.token_map.device)
        ids[self.token_map] = torch.arange(len(self.token_map), device=ids.device)
        return ids

    def drafter_state_dict(self) -> dict[str, torch.Tensor]:
        """Every tensor is the drafter's own (nothing is shared with the target)."""
        return dict(self.state_dict())

    def save_pretrained(
        self, path: Path, safe_serialization: bool = True, state_dict: dict | None = None
    ) -> None:
        """Write config.json (the heads' fields) and model.safetensors."""
        from .drafter_io import write_drafter_files

        tensors = state_dict if state_dict is not None else self.state_dict()
        write_drafter_files(path, self.fields, tensors)


def medusa_fields(config: MedusaConfig, target, family: str = "medusa1") -> dict:
    """config.json fields of heads for `target` (a `TargetAdapter`)."""
    vocab = target.lm_head.weight.shape[0]
    fields = {
        "draftzoo_family": family,
        "hidden_size": target.hidden_size,
        "vocab_size": vocab,
        "medusa_num_heads": config.num_heads,
        "medusa_num_layers": config.num_layers,
    }
    if config.draft_vocab_size is not None:
        if config.draft_vocab_size > vocab:
            raise ValueError(
                f"medusa.draft_vocab_size {config.draft_vocab_size} is larger than the "
                f"target's vocabulary ({vocab})"
            )
        if config.draft_vocab_size < vocab:
            fields["truncated_vocab_size"] = config.draft_vocab_size
    return fields


def build_medusa(
    config: MedusaConfig, target, family: str = "medusa1", token_map: torch.Tensor | None = None
) -> MedusaHeads:
    """Fresh heads for `target`: blocks at the identity, each head's projection a copy of the
    target's lm_head rows (so an untrained head predicts what the target predicts next);
    `token_map`: the draft vocabulary of truncated heads."""
    weight = target.lm_head.weight
    if weight.shape[1] != target.hidden_size:
        raise TargetError(
            f"the target's lm_head reads {weight.shape[1]} features, not its hidden size "
            f"{target.hidden_size}; Medusa heads need a plain vocabulary projection"
        )
    heads = MedusaHeads(medusa_fields(config, target, family))
    if token_map is not None:
        heads.set_token_map(token_map)
    rows = weight if heads.token_map is None else weight[heads.token_map.to(weight.device)]
    with torch.no_grad():
        for head in heads.lm_heads:
            head.weight.copy_(rows.to(head.weight))
    return heads


def medusa_head_count(path: Path) -> int:
    """How many heads the drafter in `path` has (from its config.json)."""
    try:
        return int(json.loads((Path(path) / "config.json").read_text())["medusa_num_heads"])
    except (OSError, ValueError, KeyError) as err:
        raise DrafterError(f"{path}/config.json does not describe Medusa heads: {err}") from err


def load_medusa(
    path: Path,
    target,
    dtype: torch.dtype = torch.float32,
    record: dict | None = None,
    files=None,
) -> MedusaHeads:
    """Saved heads, checked against `target` (a `TargetAdapter`): fingerprint, and every weight
    present and expected."""
    from .drafter_files import opened
    from .drafter_io import check_drafter_target

    path = Path(path)
    files = opened(path, files)
    record = check_drafter_target(path, target.fingerprint(), record or files.record)
    if record["family"] not in FAMILIES:
        raise DrafterError(f"{path} holds a {record['family']!r} drafter, not Medusa heads")
    fields = files.json()
    tensors = files.weights()
    heads = MedusaHeads(fields)
    result = heads.load_state_dict(tensors, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise DrafterError(
            f"{path}: weights do not match {fields['medusa_num_heads']} Medusa heads of "
            f"{fields['medusa_num_layers']} layer(s) (missing {result.missing_keys}, "
            f"unexpected {result.unexpected_keys})"
        )
    return heads.to(dtype=dtype, device=target.lm_head.weight.device).eval()
