"""What the bench scripts start from: the target and its tokenizer, float32, on a device."""

from __future__ import annotations

import torch

from draftzoo.inference.load import load_target as load_model_and_tokenizer


def load_target(path: str, device: str = "cpu", threads: int = 0):
    """(tokenizer, target in eval mode on `device`); `threads` > 0 sets torch's thread count."""
    if threads:
        torch.set_num_threads(threads)
    target, tokenizer = load_model_and_tokenizer(path, torch.float32, device)
    return tokenizer, target
