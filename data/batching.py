"""Token rows -> padded model inputs; packed rows keep attention inside each sample."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """A right-padded batch. `attention_mask` is [b, s] (0/1) or, when any row is packed,
    a 4D additive float mask [b, 1, s, s] that is causal within each sample only."""

    input_ids: torch.Tensor  # [b, s] long
    loss_mask: torch.Tensor  # [b, s] long; 1 where the token is supervised
    attention_mask: torch.Tensor
    position_ids: torch.Tensor  # [b, s] long, restarting at 0 in each packed sample
    indices: torch.Tensor  # [b] long, dataset row of each batch row
    lengths: tuple[tuple[int, ...], ...] = ()  # each row's sample lengths, in order

    def to(self, device) -> Batch:
        return Batch(*(t.to(device) for t in self.as_tuple()), lengths=self.lengths)

    def as_tuple(self) -> tuple[torch.Tensor, ...]:
        return (
            self.input_ids,
            self.loss_mask,
            self.attention_mask,
            self.position_ids,
            self.indices,
        )

    @property
    def packed(self) -> bool:
        return self.attention_mask.dim() == 4

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for a transformers causal LM forward."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
        }

    def supervised_targets(self) -> torch.Tensor:
        """[b, s-1] bool: position t predicts token t+1, which is supervised and real."""
        return self.loss_mask[:, 1:].bool()


def collate(rows: Sequence[dict], pad_token_id: int) -> Batch:
    """Pad rows (dicts with input_ids, loss_mask, lengths and index) into a `Batch`."""
    width = max(len(r["input_ids"]) for r in rows)
    count = len(rows)
    input_ids = torch.full((count, width), pad_token_id, dtype=torch.long)
    loss_mask = torch.zeros((count, width), dtype=torch.long)
    position_ids = torch.zeros((count, width), dtype=torch.long)
    packed = any(len(r["lengths"]) > 1 for r in rows)
    mask_2d = torch.zeros((count, width), dtype=torch.long)
    mask_4d = (
        torch.full((count, 1, width, width), torch.finfo(torch.float32).min) if packed else None
    )
    for b, row in enumerate(rows):
        n = len(row["input_ids"])
        input_ids[b, :n] = torch.tensor(row["input_ids"])
        loss_mask[b, :n] = torch.tensor(row["loss_mask"])
        mask_2d[b, :n] = 1
        start = 0
        for length in row["lengths"]:
            position_ids[b, start : start + length] = torch.arange(length)
            if mask_4d is not None:
                causal = torch.tril(torch.ones(length, length, dtype=torch.bool))
                block = mask_4d[b, 0, start : start + length, start : start + length]
                block[causal] = 0.0
            start += length
        if mask_4d is not None:
            # padding rows attend to themselves so softmax stays finite; they carry no loss
            for p in range(n, width):
                mask_4d[b, 0, p, p] = 0.0
    return Batch(
        input_ids=input_ids,
        loss_mask=loss_mask,
        attention_mask=mask_4d if packed else mask_2d,
        position_ids=position_ids,
        indices=torch.tensor([r["index"] for r in rows], dtype=torch.long),
        lengths=tuple(tuple(int(n) for n in r["lengths"]) for r in rows),
    )
