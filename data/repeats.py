"""Which tokens a model could copy from its context: token i repeats an earlier bigram.

Token x_i *repeats* when the pair (x_{i-1}, x_i) already occurred earlier in the same sample:
there is a j < i with x_{j-1} = x_{i-1} and x_j = x_i. The context then already shows what
follows x_{i-1}, so copying (look up its earlier occurrence, read the next token) predicts x_i —
as bigram statistics would for common pairs. Code and a small target's looping greedy output
are full of such tokens, and a drafter can lack the copying while predicting fresh text well;
splitting acceptance by it shows which of the two a drafter is missing.
"""

from __future__ import annotations

import torch


def repeated_bigrams(input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """[b, s] bool: x_i repeats a bigram earlier in its sample. Samples are the runs of
    `position_ids` starting at 0 (packed rows hold several; each padding slot is its own);
    the first token of a sample never repeats."""
    if input_ids.shape != position_ids.shape or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and position_ids "
            f"{tuple(position_ids.shape)} must both be [batch, seq]"
        )
    previous = torch.cat([torch.zeros_like(input_ids[:, :1]), input_ids[:, :-1]], dim=1)
    has_previous = position_ids > 0
    sample = torch.cumsum(position_ids == 0, dim=1)
    s = input_ids.shape[1]
    earlier = torch.ones(s, s, dtype=torch.bool, device=input_ids.device).tril(-1)  # [i, j]: j < i
    same_pair = (input_ids[:, :, None] == input_ids[:, None, :]) & (
        previous[:, :, None] == previous[:, None, :]
    )
    same_sample = sample[:, :, None] == sample[:, None, :]
    seen = same_pair & same_sample & earlier & has_previous[:, None, :]
    return seen.any(-1) & has_previous
