"""What the bench scripts start from: the target and its tokenizer, float32, on a device."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def load_target(path: str, device: str = "cpu", threads: int = 0):
    """(tokenizer, target in eval mode on `device`); `threads` > 0 sets torch's thread count."""
    if threads:
        torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(path)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return tokenizer, target.to(device).eval()
