"""Batched `generate` whose finished rows leave the batch.

transformers' `generate` decodes a batch until its last row ends: a row that ended early keeps
its place (padding) and costs as much as one still writing. `generate_shrinking` calls it a
few tokens at a time and, between calls, drops the rows that have ended or filled their own
room from the inputs and from the returned cache, so the rest decode at the smaller batch's
cost. Each call continues from the cache (transformers prefills only the token not in it yet),
so what a row writes is drawn from the same distribution as in one call.
"""

from __future__ import annotations

import torch

from ..architectures.target import cache_parameter, returned_cache


def generate_shrinking(
    model,
    encoded: dict[str, torch.Tensor],
    limit: int,
    rooms: list[int],
    stop: set[int],
    every: int,
    **settings,
) -> torch.Tensor:
    """The new tokens [rows, limit] of `model.generate` on the left-padded `encoded` prompts
    (`settings`: its sampling arguments and `pad_token_id`, which fills a row after it left):
    `every` tokens a call (0: one call), a row leaving the batch once it has written a `stop`
    token or its `rooms` entry of tokens."""
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    rows, device = ids.shape[0], ids.device
    new = torch.full((rows, limit), settings["pad_token_id"], dtype=ids.dtype, device=device)
    active = torch.arange(rows, device=device)
    room = torch.tensor(rooms, device=device)
    ends = torch.tensor(sorted(stop), device=device)
    cache, name, written = None, cache_parameter(type(model)), 0
    while written < limit:
        step = limit - written if every <= 0 else min(every, limit - written)
        held = {name: cache} if cache is not None else {}
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=step,
            return_dict_in_generate=True,
            **held,
            **settings,
        )
        got = out.sequences[:, ids.shape[1] :]
        new[active, written : written + got.shape[1]] = got
        written += got.shape[1]
        ended = torch.isin(new[active, :written], ends).any(1) | (room[active] <= written)
        if got.shape[1] < step or bool(ended.all()):
            break  # every row has ended
        keep = torch.nonzero(~ended, as_tuple=True)[0]
        ids = out.sequences[keep]
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], got.shape[1])], dim=1)[keep]
        cache = returned_cache(out)
        cache.batch_select_indices(keep)
        active = active[keep]
    return new
