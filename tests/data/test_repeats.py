"""`repeated_bigrams`: which tokens repeat an earlier bigram of their sample."""

from __future__ import annotations

import pytest
import torch

from draftzoo.data.repeats import repeated_bigrams


def _by_hand(ids: list[int], positions: list[int]) -> list[bool]:
    """Token i repeats when some j < i in its sample, j not the sample's first token, has
    (x_{j-1}, x_j) == (x_{i-1}, x_i)."""
    start, out = 0, []
    for i, pos in enumerate(positions):
        if pos == 0:
            start = i
            out.append(False)
            continue
        pair = (ids[i - 1], ids[i])
        out.append(any((ids[j - 1], ids[j]) == pair for j in range(start + 1, i)))
    return out


def test_a_repeated_pair_is_marked_from_its_second_occurrence():
    ids = torch.tensor([[5, 6, 7, 5, 6, 8, 5, 6, 8]])
    got = repeated_bigrams(ids, torch.arange(9)[None])
    # (5, 6) again at 4 and 7; (6, 8) again at 8; (7, 5) / (6, 8) first at 3 / 5
    assert got[0].tolist() == [False, False, False, False, True, False, False, True, True]


def test_samples_of_a_packed_row_and_padding_do_not_see_each_other():
    # two samples [5 6 5 6] and [5 6 7], then two padding slots (position 0 each)
    ids = torch.tensor([[5, 6, 5, 6, 5, 6, 7, 0, 0]])
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 0]])
    got = repeated_bigrams(ids, positions)
    assert got[0].tolist() == [False, False, False, True, False, False, False, False, False]


def test_random_packed_rows_match_the_definition():
    torch.manual_seed(0)
    ids = torch.randint(0, 4, (3, 40))
    positions = torch.zeros(3, 40, dtype=torch.long)
    for row, lengths in enumerate(([40], [10, 25, 5], [7, 7, 20, 6])):
        start = 0
        for length in lengths:
            positions[row, start : start + length] = torch.arange(length)
            start += length
    got = repeated_bigrams(ids, positions)
    for row in range(3):
        assert got[row].tolist() == _by_hand(ids[row].tolist(), positions[row].tolist())
    assert got.any() and not got.all()
    # the same pattern over ids the size of a real vocabulary's
    assert torch.equal(repeated_bigrams(ids * 40_000 + 7, positions), got)
    assert not repeated_bigrams(ids[:, :1], positions[:, :1]).any()  # nothing before


def test_shapes_must_agree():
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        repeated_bigrams(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))
