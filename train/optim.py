"""The optimizer every draftzoo recipe uses: AdamW with decay on matrices only."""

from __future__ import annotations

import torch


def param_groups(
    model: torch.nn.Module,
    weight_decay: float,
    lr: float,
    lr_scales: dict[str, float] | None = None,
) -> list[dict]:
    """Weight decay on matrices (not embeddings); none on norms, biases and embeddings. A
    parameter whose name starts with a key of `lr_scales` learns at lr x its scale, in groups
    after the two unscaled ones (whose order checkpoints rely on)."""
    groups: dict[tuple[bool, float], list] = {(True, 1.0): [], (False, 1.0): []}
    for name, param in model.named_parameters():
        decays = param.ndim >= 2 and "embed" not in name
        scale = next((s for p, s in (lr_scales or {}).items() if name.startswith(p)), 1.0)
        groups.setdefault((decays, scale), []).append(param)
    return [
        {"params": params, "weight_decay": weight_decay if decays else 0.0, "lr": lr * scale}
        for (decays, scale), params in groups.items()
    ]


def adamw(
    model: torch.nn.Module,
    lr: float,
    weight_decay: float,
    beta2: float,
    lr_scales: dict[str, float] | None = None,
):
    """AdamW over `param_groups(model, weight_decay, lr, lr_scales)`."""
    return torch.optim.AdamW(
        param_groups(model, weight_decay, lr, lr_scales), lr=lr, betas=(0.9, beta2)
    )
