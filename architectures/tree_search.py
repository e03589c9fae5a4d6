"""Choosing a static tree from measured per-position accuracies (Medusa's own tree search),
for drafters that rank every drafted position independently (Medusa heads, DFlash blocks).

`rank_accuracy[k][r]` is how often position k's r-th most likely token was the target's,
measured on held-out data. Treating the positions as independent, a path (r_1, ..., r_d) is
accepted with probability prod_i rank_accuracy[i][r_i]; a tree's expected tokens per round is 1
(the target's own) plus the sum over its paths.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

Path = tuple[int, ...]


def calibrated_choices(rank_accuracy: Sequence[Sequence[float]], nodes: int) -> list[Path]:
    """The `nodes` paths with the highest estimated acceptance, best first. A path's estimate
    is at most its parent's, so taking the best first keeps every parent (ties go to the
    shorter path)."""
    if nodes < 1 or not rank_accuracy or not all(rank_accuracy):
        raise ValueError("a calibrated tree needs nodes >= 1 and accuracies for every head")
    ranks = [[float(a) for a in row] for row in rank_accuracy]
    frontier = [(-p, 1, (r,)) for r, p in enumerate(ranks[0])]
    heapq.heapify(frontier)
    chosen: list[Path] = []
    while frontier and len(chosen) < nodes:
        estimate, _, path = heapq.heappop(frontier)
        chosen.append(path)
        if len(path) < len(ranks):
            for r, p in enumerate(ranks[len(path)]):
                child = (*path, r)
                heapq.heappush(frontier, (estimate * p, len(child), child))
    return chosen


def estimated_acceptance(paths: Sequence[Path], rank_accuracy: Sequence[Sequence[float]]) -> float:
    """Expected tokens per round of the tree `paths` under per-head independence."""
    total = 1.0
    for path in paths:
        estimate = 1.0
        for depth, r in enumerate(path):
            row = rank_accuracy[depth] if depth < len(rank_accuracy) else []
            estimate *= row[r] if r < len(row) else 0.0
        total += estimate
    return total
