"""How captured target states are stored and what the trainer reads back.

A float format stores the states rounded to that dtype. `float8_e4m3` stores each token's state
as FP8 (e4m3) divided by one float32 scale per token and layer (its largest magnitude over 448,
e4m3's largest finite value), about half of bfloat16 on disk; it reads back as float32
`q * scale`. Online capture rounds through the same functions, so a drafter sees the same
numbers whichever mode fed it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..architectures.errors import DraftzooError

FP8_FORMAT = "float8_e4m3"
FLOAT_FORMATS = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
STORAGE_FORMATS = (*FLOAT_FORMATS, FP8_FORMAT)
FP8_MAX = 448.0  # e4m3fn's largest finite magnitude
#: the dtype names safetensors writes in a shard's header
SAFETENSORS_DTYPES = {
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float32: "F32",
    getattr(torch, "float8_e4m3fn", None): "F8_E4M3",
}


class FeatureStorageError(DraftzooError, ValueError):
    """A storage format this torch build cannot hold, or shard contents that are not it."""


@dataclass(frozen=True)
class FeatureStorage:
    """One storage format of captured states (`capture.dtype`)."""

    name: str

    def __post_init__(self) -> None:
        if self.name not in STORAGE_FORMATS:
            raise FeatureStorageError(
                f"capture.dtype must be one of {', '.join(STORAGE_FORMATS)}, got {self.name!r}"
            )
        if self.is_fp8 and getattr(torch, "float8_e4m3fn", None) is None:
            raise FeatureStorageError(
                f"capture.dtype {FP8_FORMAT}: torch {torch.__version__} has no float8_e4m3fn "
                "dtype; use bfloat16"
            )

    @property
    def is_fp8(self) -> bool:
        return self.name == FP8_FORMAT

    @property
    def stored_dtype(self) -> torch.dtype:
        """The dtype of the state tensors in a shard."""
        return torch.float8_e4m3fn if self.is_fp8 else FLOAT_FORMATS[self.name]

    @property
    def read_dtype(self) -> torch.dtype:
        """The dtype the trainer receives."""
        return torch.float32 if self.is_fp8 else FLOAT_FORMATS[self.name]

    def bytes_per_token(self, hidden_size: int, layers: Sequence[int]) -> int:
        """Disk bytes one token's states take (the per-token scales included)."""
        element = torch.tensor([], dtype=self.stored_dtype).element_size()
        scale = 4 if self.is_fp8 else 0
        return len(layers) * (hidden_size * element + scale)

    def encode(self, states: torch.Tensor) -> dict[str, torch.Tensor]:
        """{"hidden": stored states [.., h], "scale": [..] float32 (FP8 only)}."""
        if not self.is_fp8:
            return {"hidden": states.to(self.stored_dtype)}
        wide = states.float()
        amax = wide.abs().amax(-1)
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        return {"hidden": (wide / scale[..., None]).to(self.stored_dtype), "scale": scale}

    def decode(self, hidden: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """The states the trainer reads from their stored form."""
        if not self.is_fp8:
            return hidden.to(self.read_dtype)
        return hidden.float() * scale[..., None].float()

    def round(self, states: torch.Tensor) -> torch.Tensor:
        """`states` as they come back from storage (what online capture hands the trainer)."""
        return self.decode(**self.encode(states))

    def check_shard(self, handle, name: str, layers: Sequence[int]) -> None:
        """Refuse a shard whose tensors are not this format (one line naming the shard)."""
        want = SAFETENSORS_DTYPES[self.stored_dtype]
        keys = set(handle.keys())
        for layer in layers:
            key = f"hidden.{layer}"
            if key not in keys:
                raise FeatureStorageError(f"{name} has no {key}; capture again")
            got = handle.get_slice(key).get_dtype()
            if got != want:
                raise FeatureStorageError(
                    f"{name} holds {key} as {got}, its index says {self.name} ({want}); "
                    "capture again"
                )
            if self.is_fp8 and f"scale.{layer}" not in keys:
                raise FeatureStorageError(
                    f"{name} has no scale.{layer}, which {self.name} needs; capture again"
                )
