"""What both Medusa clients give the reference's `MedusaModel` as its base model.

Imported by the client scripts from their own folder; uses only torch and safetensors.
"""

from pathlib import Path

import torch
from safetensors import safe_open


def target_head(path: str) -> torch.Tensor:
    """The target's output matrix, as its checkpoint stores it (tied: the embedding)."""
    with safe_open(str(Path(path) / "model.safetensors"), framework="pt") as handle:
        keys = set(handle.keys())
        key = "lm_head.weight" if "lm_head.weight" in keys else "model.embed_tokens.weight"
        return handle.get_tensor(key).float()


class Base(torch.nn.Module):
    """What `MedusaModel` reads of its base model: `config`, `lm_head`, `dtype`, `device`."""

    dtype = torch.float32
    device = torch.device("cpu")

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.config = None
        self.lm_head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        self.lm_head.weight.data[:] = weight
