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
    the first token of a sample never repeats. Memory and time grow as b x s log(b x s)."""
    if input_ids.shape != position_ids.shape or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and position_ids "
            f"{tuple(position_ids.shape)} must both be [batch, seq]"
        )
    ids, positions = input_ids.flatten(), position_ids.flatten()
    sample = torch.cumsum(positions == 0, dim=0)  # rows start at position 0: ids run on
    has_previous = torch.nonzero(positions > 0).squeeze(1)
    vocab = int(ids.max()) + 1 if len(ids) else 1
    # one integer per (sample, previous token, token); every factor stays below 2**63 for
    # vocabularies up to ~10**6 and a million tokens per batch
    keys = (sample[has_previous] * vocab + ids[has_previous - 1]) * vocab + ids[has_previous]
    _, group = torch.unique(keys, return_inverse=True)
    order = torch.arange(len(keys), device=keys.device)
    first = torch.full((int(group.max()) + 1 if len(group) else 0,), len(keys), device=keys.device)
    first = first.scatter_reduce(0, group, order, reduce="amin")
    repeated = torch.zeros_like(ids, dtype=torch.bool)
    repeated[has_previous] = order > first[group]
    return repeated.view_as(input_ids)
