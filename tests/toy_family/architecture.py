"""The bigram drafter: embed(x_t) -> projection -> logits of x_{t+1}."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from draftzoo.architectures.drafter_io import (
    DrafterError,
    check_drafter_target,
    read_drafter_weights,
    write_drafter_files,
)
from draftzoo.architectures.families import FamilySpec

FAMILY = "toy_bigram"
TOY_SPEC = FamilySpec(
    name=FAMILY,
    display_name="Toy bigram",
    recipe="tests.toy_family.training:BigramRecipe",
    runtime="tests.toy_family.runtime:load_runtime",
    exporters={"npz": "tests.toy_family.export:export_npz"},
    recipes_dir="toy_bigram",
    tests=("tests/test_family_registry.py",),
)


@dataclass(frozen=True)
class BigramConfig:
    """The drafter's width."""

    hidden_size: int = 32  # the embedding's width


class BigramDrafter(nn.Module):
    """Logits of the next token from the last token alone."""

    def __init__(self, fields: dict) -> None:
        super().__init__()
        self.fields = dict(fields)
        self.embed = nn.Embedding(fields["vocab_size"], fields["hidden_size"])
        self.head = nn.Linear(fields["hidden_size"], fields["vocab_size"], bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [...] -> logits [..., V]."""
        return self.head(self.embed(tokens))

    def save_pretrained(
        self, path: Path, safe_serialization: bool = True, state_dict: dict | None = None
    ) -> None:
        tensors = self.state_dict() if state_dict is None else state_dict
        write_drafter_files(path, self.fields, tensors)


def build_bigram(config: BigramConfig, vocab_size: int) -> BigramDrafter:
    return BigramDrafter({"vocab_size": vocab_size, "hidden_size": config.hidden_size})


def load_bigram(path: Path, target, dtype: torch.dtype, record: dict) -> BigramDrafter:
    """A saved bigram drafter checked against `target` (a `TargetAdapter`)."""
    import json

    check_drafter_target(path, target.fingerprint(), record)
    if record["family"] != FAMILY:
        raise DrafterError(f"{path} holds a {record['family']!r} drafter, not a bigram one")
    drafter = BigramDrafter(json.loads((Path(path) / "config.json").read_text()))
    drafter.load_state_dict(read_drafter_weights(path), strict=True)
    return drafter.to(device=target.model.device, dtype=dtype).eval()
