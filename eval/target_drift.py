"""How far a Medusa-2 adapter moved its target, as its card reports it.

Training measures the held-out side (loss of the original and the adapted target, mean
KL(original || adapted); `draftzoo.json` training.target_drift). The evaluation adds greedy
agreement on its own prompts: target-only greedy decoding with the original target, then with
the adapted (merged) one, compared token for token.
"""

from __future__ import annotations

from typing import Any

from ..inference.generate import SpeculativeGenerator
from ..inference.sampling import SamplingParams


def greedy_tokens(target, tokenizer, texts: list[str], max_new_tokens: int) -> list[list[int]]:
    """Target-only greedy continuations of `texts`."""
    generator = SpeculativeGenerator(target, tokenizer, None)
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    return [generator.generate(text, params).token_ids for text in texts]


def greedy_agreement(original: list[list[int]], adapted: list[list[int]]) -> dict[str, Any]:
    """Share of prompts whose two continuations are identical, and the mean share of each
    continuation generated before the two first differ."""
    prefixes = []
    for before, after in zip(original, adapted, strict=True):
        same = 0
        for a, b in zip(before, after, strict=False):
            if a != b:
                break
            same += 1
        longest = max(len(before), len(after), 1)
        prefixes.append(1.0 if before == after else same / longest)
    identical = sum(before == after for before, after in zip(original, adapted, strict=True))
    return {
        "prompts": len(original),
        "identical": identical,
        "identical_share": identical / max(len(original), 1),
        "mean_agreeing_prefix_share": sum(prefixes) / max(len(prefixes), 1),
    }


def drift_section(record: dict[str, Any], agreement: dict[str, Any]) -> dict[str, Any]:
    """The report's `target_drift`: training's held-out figures and the greedy agreement."""
    return {
        **record.get("training", {}).get("target_drift", {}),
        "greedy_agreement": agreement,
        "identity_checked_against": "the adapted (merged) target",
    }
