"""Each packed sample run on its own gives the states of the packed, masked forward."""

from __future__ import annotations

import pytest
import torch

from draftzoo.architectures.target import TargetAdapter
from draftzoo.data.batching import collate
from draftzoo.data.sample_forward import length_groups, sample_spans, states_by_sample
from tests.conftest import tiny_causal_lm


def _rows(lengths_per_row, seed=0):
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for index, lengths in enumerate(lengths_per_row):
        ids = torch.randint(1, 96, (sum(lengths),), generator=generator).tolist()
        rows.append(
            {"input_ids": ids, "loss_mask": [1] * len(ids), "lengths": lengths, "index": index}
        )
    return rows


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("packed", [True, False])
def test_states_by_sample_equal_the_masked_forward(kind, packed):
    adapter = TargetAdapter(tiny_causal_lm(kind))
    shape = [[9, 30, 2], [41], [5, 5, 5, 17]] if packed else [[41], [12], [30]]
    batch = collate(_rows(shape), pad_token_id=0)
    assert batch.packed == packed
    layers = [1, adapter.num_layers]
    with torch.no_grad():
        masked = adapter(**batch.model_inputs(), hidden_indices=layers, compute_logits=False)
    for budget in (None, 41, 1):  # one group per batch, several, one sample each
        states = states_by_sample(adapter, batch, layers, budget)
        real = batch.loss_mask.bool()
        for layer in layers:
            assert states[layer].shape == masked.hidden_states[layer].shape
            torch.testing.assert_close(
                states[layer][real], masked.hidden_states[layer][real], atol=1e-5, rtol=1e-5
            )
            assert not states[layer][~real].any()  # padding holds zeros


def test_spans_and_groups():
    batch = collate(_rows([[3, 4], [5]]), pad_token_id=0)
    assert sample_spans(batch) == [(0, 0, 3), (0, 3, 4), (1, 0, 5)]
    assert sample_spans(batch.to("cpu")) == sample_spans(batch)  # lengths travel with it
    assert length_groups(sample_spans(batch), 10) == [[(1, 0, 5), (0, 3, 4)], [(0, 0, 3)]]
    assert length_groups([(0, 0, 12)], 10) == [[(0, 0, 12)]]  # longer than the budget: alone
    plain = collate(_rows([[6], [2]]), pad_token_id=0)
    plain.lengths = ()
    assert sample_spans(plain) == [(0, 0, 6), (1, 0, 2)]  # one sample a row, its mask's length
    packed = collate(_rows([[2, 2]]), pad_token_id=0)
    packed.lengths = ()
    with pytest.raises(ValueError, match="without its sample lengths"):
        sample_spans(packed)
