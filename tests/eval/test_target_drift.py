"""Greedy agreement between the original and the adapted target, as Medusa-2 cards report it."""

from __future__ import annotations

import pytest

from draftzoo.eval.target_drift import drift_section, greedy_agreement


def test_agreement_counts_identical_continuations_and_the_shared_prefix():
    original = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9]]
    adapted = [[1, 2, 3, 4], [5, 6, 0, 8], [1, 9]]
    agreement = greedy_agreement(original, adapted)
    assert agreement["prompts"] == 3 and agreement["identical"] == 1
    assert agreement["identical_share"] == pytest.approx(1 / 3)
    assert agreement["mean_agreeing_prefix_share"] == pytest.approx((1 + 0.5 + 0) / 3)


def test_drift_section_keeps_the_held_out_figures_and_names_the_reference():
    record = {"training": {"target_drift": {"kl_original_adapted": 0.01}}}
    section = drift_section(record, greedy_agreement([[1]], [[1]]))
    assert section["kl_original_adapted"] == 0.01
    assert section["greedy_agreement"]["identical"] == 1
    assert "adapted" in section["identity_checked_against"]
