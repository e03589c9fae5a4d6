"""The calibrated Medusa tree: Medusa's best-first choice of paths from per-head rank
accuracies, checked against brute force on a small case."""

from __future__ import annotations

import itertools

import pytest

from draftzoo.architectures.tree_search import calibrated_choices, estimated_acceptance
from draftzoo.inference.proposers.medusa import MedusaTree

ACCURACY = [[0.5, 0.2, 0.1], [0.35, 0.15, 0.05], [0.3, 0.1, 0.02]]


def _valid_trees(nodes: int):
    """Every prefix-closed set of `nodes` paths over 3 heads x 3 ranks."""
    paths = [p for d in (1, 2, 3) for p in itertools.product(range(3), repeat=d)]
    for chosen in itertools.combinations(paths, nodes):
        kept = set(chosen)
        if all(p[:-1] in kept for p in chosen if len(p) > 1):
            yield chosen


@pytest.mark.parametrize("nodes", [1, 3, 5])
def test_best_first_is_the_best_tree_of_its_size(nodes):
    chosen = calibrated_choices(ACCURACY, nodes)
    assert len(chosen) == nodes
    best = max(estimated_acceptance(t, ACCURACY) for t in _valid_trees(nodes))
    assert estimated_acceptance(chosen, ACCURACY) == pytest.approx(best)
    MedusaTree(tuple(chosen))  # every parent present


def test_calibrated_tree_beats_the_default_on_its_own_accuracies():
    accuracy = [[0.6, 0.15, 0.05, 0.03], [0.4, 0.1, 0.05], [0.3, 0.1], [0.2, 0.1]]
    tree = MedusaTree.calibrated(accuracy, 16)
    assert len(tree.choices) == 16 and tree.depth <= 4
    assert tree.estimated_acceptance(accuracy) >= MedusaTree.default(4).estimated_acceptance(
        accuracy
    )


def test_refuses_an_empty_request():
    with pytest.raises(ValueError):
        calibrated_choices([], 4)
    with pytest.raises(ValueError):
        calibrated_choices(ACCURACY, 0)
