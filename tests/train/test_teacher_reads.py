"""The target read once per micro-batch: the same reads, losses and gradients as per step."""

from __future__ import annotations

import pytest
import torch

from draftzoo.train.eagle_losses import eagle3_loss_sums
from draftzoo.train.teacher_reads import read_positions, read_teacher, read_teacher_once


@pytest.mark.parametrize("kept", ["mask", "ids", "none", "empty"])
def test_reads_once_equal_each_rows_own_reads(kept):
    torch.manual_seed(0)
    vocab, h = 11, 6
    head = torch.nn.Linear(h, vocab)
    final = torch.randn(2, 7, h)
    ids = torch.tensor([1, 4, 5, 8, 10])
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[ids] = True
    chosen = {"mask": mask, "ids": ids, "none": None, "empty": ids[:0]}[kept]
    width = {"mask": 5, "ids": 5, "none": vocab, "empty": 0}[kept]
    rows = read_teacher(head, final.reshape(14, h), chosen, True)
    full = head(final.reshape(14, h)).detach()
    assert torch.equal(rows.wanted, full.argmax(-1))
    torch.testing.assert_close(rows.log_norm, torch.logsumexp(full, -1))
    torch.testing.assert_close(rows.logits, full if chosen is None else full[:, chosen])
    assert rows.logits.shape == (14, width) and rows.logits.dtype == torch.float32
    fits = [
        chunk for chunk in (None, 1, 3, 7, 14, 100) if chunk is None or 14 * width <= chunk * vocab
    ]
    for chunk in (None, 1, 3, 7, 14, 100):
        once = read_teacher_once(head, final, chosen, True, chunk, vocab)
        if chunk not in fits:  # holding the reads would take more than one chunk's projection
            assert once is None
            continue
        for got, expected in zip(once, rows, strict=True):
            torch.testing.assert_close(got.reshape(expected.shape), expected)
    assert 100 in fits and (kept == "empty") == (1 in fits)
    # only the positions a loss reads are projected; the others hold zeros
    read = torch.rand(2, 7) < 0.5
    projected = []
    once = read_teacher_once(
        lambda f: projected.append(len(f)) or head(f), final, chosen, True, None, vocab, read
    )
    assert projected[-1] == int(read.sum())
    flat_read = read.reshape(14)
    for got, expected in zip(once, rows, strict=True):
        got = got.reshape(expected.shape)
        torch.testing.assert_close(got[flat_read], expected[flat_read])
        assert not got[~flat_read].any()
    nothing = read_teacher_once(head, final, chosen, True, None, vocab, torch.zeros(2, 7).bool())
    assert all(not part.any() for part in nothing)


def test_read_positions_are_each_steps_positions_ahead():
    first = torch.tensor([[True, True, False, False, False]])
    second = torch.tensor([[False, True, False, False, False]])
    # step 0 reads t + 1 (1, 2), step 1 reads t + 2 (3)
    assert read_positions([first, second]).tolist() == [[False, True, True, True, False]]


@pytest.mark.parametrize("token_loss", ["ce", "tvd", "lk"])
def test_eagle3_loss_is_the_same_read_once_or_per_step(token_loss):
    """A pruned draft vocabulary: chunks of 100 rows hold the reads (one projection), chunks of
    2 do not (each step projects its own rows), no chunks at all hold them; same loss, same
    gradients, same hits."""
    torch.manual_seed(0)
    vocab, draft, steps, s, h = 40, 8, 3, 12, 5
    t2d = torch.zeros(vocab, dtype=torch.bool)
    kept = torch.randperm(vocab)[:draft].sort().values
    t2d[kept] = True
    d2t = kept - torch.arange(draft)
    select = [torch.arange(s)[None] + 2 + j < s for j in range(steps)]
    teacher = torch.nn.Linear(h, vocab)
    final = torch.randn(1, s, h)
    assert read_teacher_once(teacher, final, t2d, False, 2, vocab) is None
    assert read_teacher_once(teacher, final, t2d, False, 100, vocab) is not None
    results, projected = [], []

    def counted(states):
        projected.append(states.shape[0])
        return teacher(states)

    for chunk in (None, 100, 2):
        torch.manual_seed(1)
        outputs = [torch.randn(int(k.sum()), draft, requires_grad=True) for k in select]
        same = torch.nn.Identity()
        projected.clear()
        loss, stats = eagle3_loss_sums(
            outputs,
            select,
            final,
            same,
            counted,
            d2t,
            t2d,
            0.8,
            token_loss=token_loss,
            chunk=chunk,
        )
        loss.backward()
        if chunk != 2:  # read once: positions 1 .. s - 2 only (no step reads 0 or s - 1)
            assert sum(projected) == s - 2
        results.append((loss.detach(), [o.grad for o in outputs], stats))
    for loss, grads, stats in results[1:]:
        torch.testing.assert_close(loss, results[0][0])
        for got, want in zip(grads, results[0][1], strict=True):
            torch.testing.assert_close(got, want)
        assert all(torch.equal(stats[k], results[0][2][k]) for k in stats)
