"""Which dataset rows each process trains on at each optimizer step, as a pure function.

Rows form one endless stream: epoch e is a permutation of all rows seeded by (seed, e). Step s
takes the next `world x grad_accum x micro_batch` rows of the stream; rank r gets every
`world`-th of them starting at r. A resumed run therefore sees exactly the rows an
uninterrupted one would, and ranks never share a row within a step.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=4)
def _epoch_order(num_rows: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(num_rows)


def step_rows(
    num_rows: int,
    seed: int,
    step: int,
    micro_batch_size: int,
    grad_accum: int,
    rank: int,
    world_size: int,
) -> list[list[int]]:
    """`grad_accum` micro-batches (lists of row indices) for `rank` at optimizer `step`."""
    per_step = micro_batch_size * grad_accum * world_size
    start = step * per_step
    stream = [
        int(_epoch_order(num_rows, seed, k // num_rows)[k % num_rows])
        for k in range(start, start + per_step)
    ]
    mine = stream[rank::world_size]
    return [mine[i * micro_batch_size : (i + 1) * micro_batch_size] for i in range(grad_accum)]


def data_passes(
    num_rows: int, steps: int, micro_batch_size: int, grad_accum: int, world_size: int
) -> float:
    """How many times `steps` optimizer steps go through the `num_rows` rows of the stream."""
    return steps * micro_batch_size * grad_accum * world_size / num_rows
