"""The chain acceptance length that per-step draft accuracies imply (training logs and eval)."""

from __future__ import annotations


def simulated_acceptance_length(accuracies: list[float]) -> float:
    """1 + sum_j prod_{i<=j} acc_i: the tau a chain of len(accuracies) drafts would reach if
    each step's teacher-forced accuracy were its acceptance rate given the previous ones."""
    tau, survive = 1.0, 1.0
    for acc in accuracies:
        survive *= acc
        tau += survive
    return tau
