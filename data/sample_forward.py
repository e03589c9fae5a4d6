"""The target's hidden states on a batch, each sample of a packed row run on its own.

A packed row keeps attention inside each of its samples with a 4D additive mask: the forward
pays attention over the whole row's square and takes SDPA's masked path. A sample run on its
own needs no mask at all: under causal attention no position reads the right padding after
it, and its positions start at 0 as they do in the row. So the samples are sorted by length,
grouped up to a token budget, run unmasked and written back where they sit in their rows:
the same states, to float rounding, for less work (SmolLM2, 8 packed rows of 1,024 on two
cores: bench/results/cpu-2026-12-07-capture-by-sample/).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .batching import Batch

#: (batch row, first position in it, length) of one sample
Span = tuple[int, int, int]


def sample_spans(batch: Batch) -> list[Span]:
    """Every sample of `batch` where it sits; a batch collated without lengths has one sample
    per row, its unpadded length."""
    if batch.lengths:
        spans = []
        for row, lengths in enumerate(batch.lengths):
            start = 0
            for length in lengths:
                spans.append((row, start, length))
                start += length
        return spans
    if batch.packed:
        raise ValueError("a packed batch without its sample lengths cannot be split by sample")
    return [(row, 0, int(n)) for row, n in enumerate(batch.attention_mask.sum(-1).tolist())]


def length_groups(spans: Sequence[Span], budget: int) -> list[list[Span]]:
    """Spans, longest first, in groups whose padded size (longest length x count) stays within
    `budget` tokens; a sample longer than the budget runs alone."""
    groups: list[list[Span]] = []
    for span in sorted(spans, key=lambda s: -s[2]):
        if groups and groups[-1][0][2] * (len(groups[-1]) + 1) <= budget:
            groups[-1].append(span)
        else:
            groups.append([span])
    return groups


@torch.no_grad()
def states_by_sample(
    adapter, batch: Batch, layers: Sequence[int], budget: int | None = None
) -> dict[int, torch.Tensor]:
    """Hidden states {HF index: [b, s, h]} of the target on `batch`, every sample run
    unmasked on its own (groups of at most `budget` tokens, default the batch's b x s);
    padding positions hold zeros."""
    count, width = batch.input_ids.shape
    groups = length_groups(sample_spans(batch), budget or count * width)
    states: dict[int, torch.Tensor] = {}
    for group in groups:
        longest = group[0][2]
        ids = batch.input_ids.new_zeros(len(group), longest)
        for i, (row, start, length) in enumerate(group):
            ids[i, :length] = batch.input_ids[row, start : start + length]
        out = adapter(ids, hidden_indices=layers, compute_logits=False)
        for layer in layers:
            hidden = out.hidden_states[layer]
            if layer not in states:
                states[layer] = hidden.new_zeros(count, width, hidden.shape[-1])
            for i, (row, start, length) in enumerate(group):
                states[layer][row, start : start + length] = hidden[i, :length]
    return states
