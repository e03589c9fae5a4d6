"""How good a target LM is at continuing code: repetition of its greedy continuations."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..architectures.defaults import MAX_NEW_TOKENS


def repeated_ngram_share(tokens: Sequence[int], n: int = 4) -> float:
    """Share of the n-grams of `tokens` that already occurred earlier in `tokens`.

    Real code windows of the testbed corpus score about 0.1; a looping greedy decoder near 1.
    """
    seen: set[tuple[int, ...]] = set()
    repeated = total = 0
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i : i + n])
        total += 1
        repeated += gram in seen
        seen.add(gram)
    return repeated / total if total else 0.0


def reference_share(tokens: np.ndarray, window: int, count: int = 64) -> float:
    """Mean repeated-4-gram share of `count` evenly spaced real-text windows of `window` tokens."""
    starts = np.linspace(0, tokens.size - window, num=count).astype(np.int64)
    return sum(repeated_ngram_share(tokens[s : s + window].tolist()) for s in starts) / count


@torch.no_grad()
def measure_continuations(
    model_dir: Path,
    prompts: int = 16,
    max_new_tokens: int = MAX_NEW_TOKENS,
    examples: int = 3,
    reference_tokens: np.ndarray | None = None,
) -> dict:
    """Greedy continuations of the first HumanEval prompts and their repeated-4-gram share.

    With `reference_tokens` (held-out real code), the same share over windows of real code of
    the same length is reported beside it.
    """
    from transformers import AutoTokenizer

    from draftzoo.architectures.safe_load import load_causal_lm
    from draftzoo.data.prompts import humaneval_prompts

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_causal_lm(model_dir, dtype=torch.float32).eval()
    shares, samples = [], []
    for prompt in humaneval_prompts()[:prompts]:
        input_ids = tokenizer(prompt.text, return_tensors="pt").input_ids
        output = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        new = output[0, input_ids.shape[1] :].tolist()
        shares.append(repeated_ngram_share(new))
        if len(samples) < examples:
            samples.append(
                {
                    "prompt_id": prompt.prompt_id,
                    "prompt": prompt.text,
                    "continuation": tokenizer.decode(new),
                }
            )
    result = {
        "prompts": len(shares),
        "max_new_tokens": max_new_tokens,
        "repeated_4gram_share": round(sum(shares) / len(shares), 4),
    }
    if reference_tokens is not None:
        share = reference_share(reference_tokens, max_new_tokens)
        result["heldout_code_repeated_4gram_share"] = round(share, 4)
    return result | {"examples": samples}
