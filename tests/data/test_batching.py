"""Packed rows keep attention inside each sample: same logits as unpacked forwards."""

from __future__ import annotations

import torch

from draftzoo.data.batching import collate
from draftzoo.data.loss_mask import Tokenized
from draftzoo.data.token_dataset import _pack
from tests.conftest import tiny_causal_lm


def test_packing_groups_whole_samples_in_order():
    items = [(i, Tokenized([i] * n, [1] * n)) for i, n in enumerate([3, 4, 5, 2])]
    rows = list(_pack(items, max_length=8))
    assert [r["lengths"] for r in rows] == [[3, 4], [5, 2]]
    assert rows[0]["input_ids"] == [0, 0, 0, 1, 1, 1, 1]


def test_packed_forward_equals_separate_forwards():
    model = tiny_causal_lm("llama")
    torch.manual_seed(1)
    a, b = torch.randint(0, 96, (5,)).tolist(), torch.randint(0, 96, (7,)).tolist()
    packed = collate(
        [
            {"input_ids": a + b, "loss_mask": [1] * 12, "lengths": [5, 7], "index": 0},
            {"input_ids": a, "loss_mask": [1] * 5, "lengths": [5], "index": 1},  # padded row
        ],
        pad_token_id=0,
    )
    assert packed.packed and packed.position_ids[0].tolist() == [*range(5), *range(7)]
    with torch.no_grad():
        logits = model(**packed.model_inputs()).logits
        alone_a = model(input_ids=torch.tensor([a])).logits[0]
        alone_b = model(input_ids=torch.tensor([b])).logits[0]
    torch.testing.assert_close(logits[0, :5], alone_a, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(logits[0, 5:], alone_b, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(logits[1, :5], alone_a, atol=1e-5, rtol=1e-4)
    assert packed.loss_mask[1, 5:].sum() == 0  # padding carries no loss


def test_unpacked_batch_uses_a_2d_mask_and_right_padding():
    batch = collate(
        [
            {"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1], "lengths": [3], "index": 4},
            {"input_ids": [8], "loss_mask": [1], "lengths": [1], "index": 9},
        ],
        pad_token_id=0,
    )
    assert not batch.packed
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch.supervised_targets().tolist() == [[True, True], [False, False]]
    assert batch.indices.tolist() == [4, 9]
