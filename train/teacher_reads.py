"""What a loss reads of the target's distribution, projected from its final states once.

EAGLE-3's training-time test scores k steps against the target's distribution at positions
t + 1 .. t + k, Medusa's heads likewise: projecting the final states to the whole vocabulary
once per step repeats the same work k times (on SmolLM2, a third of an EAGLE-3 step).
`read_teacher_once` projects every position those losses read in a micro-batch once and keeps
only what they read: the argmax over the whole vocabulary, float32 logits on the kept (draft)
vocabulary, and where asked the log-normaliser over the whole vocabulary. It does so only when
holding that costs no more memory than one chunk of the projection itself (`loss_chunk_rows`
rows x the vocabulary): with a pruned draft vocabulary, or an unchunked loss. Otherwise each
step reads its own rows (`read_teacher`), as before; the values are the same either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

#: rows projected at a time: the whole-vocabulary logits of a block stay small (their values
#: do not depend on it)
READ_BLOCK = 512


class TeacherReads(NamedTuple):
    """The target at some positions, reduced to what the losses read."""

    wanted: torch.Tensor  # [...] long: argmax over the whole vocabulary
    logits: torch.Tensor  # [..., kept] float32: logits on the kept vocabulary
    log_norm: torch.Tensor  # [...] float32: logsumexp over the whole vocabulary (0 unless asked)


@torch.no_grad()
def read_teacher(
    head: Callable[[torch.Tensor], torch.Tensor],  # final states -> logits (any float dtype)
    final: torch.Tensor,  # [n, h]
    kept: torch.Tensor | None,  # bool mask or ids of the kept vocabulary; None: all of it
    with_norm: bool,
) -> TeacherReads:
    """The reads of `final`'s rows."""
    logits = head(final)
    wanted = logits.argmax(-1)
    kept_logits = (logits if kept is None else logits[:, kept]).float()
    if with_norm:
        norm = torch.logsumexp(logits.float(), dim=-1)
    else:
        norm = kept_logits.new_zeros(wanted.shape)
    return TeacherReads(wanted, kept_logits, norm)


def kept_size(kept: torch.Tensor | None, vocab: int) -> int:
    """How many logits a row keeps."""
    if kept is None:
        return vocab
    return int(kept.sum()) if kept.dtype == torch.bool else kept.numel()


def read_positions(selects: list[torch.Tensor]) -> torch.Tensor:
    """[b, s] bool: the positions read when step (or head) j reads position t + 1 + j for each
    of its positions t, `selects[j]` [b, s]."""
    read = torch.zeros_like(selects[0], dtype=torch.bool)
    width = read.shape[1]
    for j, select in enumerate(selects):
        read[:, 1 + j :] |= select[:, : max(width - 1 - j, 0)].bool()
    return read


@torch.no_grad()
def read_teacher_once(
    head: Callable[[torch.Tensor], torch.Tensor],
    final: torch.Tensor,  # [b, s, h]
    kept: torch.Tensor | None,
    with_norm: bool,
    chunk: int | None,  # the loss's rows per vocabulary projection (None: all at once)
    vocab: int,
    read: torch.Tensor | None = None,  # [b, s] bool: the positions a loss reads (None: all)
) -> TeacherReads | None:
    """The reads of every position [b, s, ...], projected `chunk` rows at a time; None when
    holding them would take more memory than one chunk's projection. With `read`, only those
    positions are projected (no loss reads a user turn, padding or a sample's first tokens:
    a third of a ShareGPT row); the others hold zeros."""
    b, s, h = final.shape
    positions = b * s
    if chunk is not None and positions * kept_size(kept, vocab) > chunk * vocab:
        return None
    flat = final.reshape(positions, h)
    rows = None if read is None else torch.nonzero(read.reshape(positions), as_tuple=True)[0]
    chosen = flat if rows is None else flat[rows]
    step = min(chunk or positions, READ_BLOCK)
    parts = [
        read_teacher(head, chosen[lo : lo + step], kept, with_norm)
        for lo in range(0, max(chosen.shape[0], 1), step)
    ]
    columns = [torch.cat(column) for column in zip(*parts, strict=True)]
    if rows is not None:
        columns = [_spread(column, rows, positions) for column in columns]
    return TeacherReads(*(column.reshape(b, s, *column.shape[1:]) for column in columns))


def _spread(values: torch.Tensor, rows: torch.Tensor, positions: int) -> torch.Tensor:
    """[positions, ...]: `values` at `rows`, zeros elsewhere."""
    spread = values.new_zeros(positions, *values.shape[1:])
    spread[rows] = values
    return spread
