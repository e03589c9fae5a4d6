"""The optimizer every draftzoo recipe uses: AdamW with decay on matrices only."""

from __future__ import annotations

import torch


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices (not embeddings); none on norms, biases and embeddings."""
    decay, other = [], []
    for name, param in model.named_parameters():
        (decay if param.ndim >= 2 and "embed" not in name else other).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]


def adamw(model: torch.nn.Module, lr: float, weight_decay: float, beta2: float):
    """AdamW over `param_groups(model, weight_decay)`."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=(0.9, beta2))
