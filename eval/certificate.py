"""The losslessness certificate: sampled output of the real checkpoint against the target's.

For each of a few prompts, N speculative decodes at T = 1 of the first L tokens (with the
drafter's own serving settings and the evaluation's acceptance rule) give an empirical
distribution of L-token outcomes. The target's exact distribution of the same outcomes is
enumerated from its conditionals. Outcomes the target expects fewer than `min_expected` times
in N draws share one "rest" bin (a partition fixed before sampling, so the test stays valid).
The total-variation distance between the two over the bins is tested against

    threshold = sum_b sqrt(p_b (1 - p_b) / N) / 2  +  sqrt(ln(1 / delta) / (2 N)),

the bound the test suite applies to tiny models: the first term bounds E[TV] (Jensen), the
second is McDiarmid's (TV moves by at most 1/N per sample), so a lossless runtime exceeds it
with probability below delta. delta = false_alarm / prompts, so the whole certificate fails a
lossless runtime with probability below `false_alarm` (union bound). A rule that moves the
distribution by much more than the threshold fails it (the tests show an accept-every-draft
rule and Medusa's typical acceptance failing). The first round drafts L - 1 tokens, so every
outcome passes through the acceptance rule.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from ..architectures.defaults import CERTIFICATE_PROMPTS, CERTIFICATE_SAMPLES
from ..inference.batch import BatchGenerator
from ..inference.cache_settings import GROWING, CacheSettings
from ..inference.round import encode_prompt, eos_ids
from ..inference.sampling import SamplingParams, probabilities, sample

REST = "rest"


@dataclass(frozen=True)
class CertificateConfig:
    """How the sampled losslessness check is run."""

    prompts: int = CERTIFICATE_PROMPTS  # the first prompts of the evaluation (after warm-up)
    samples: int = CERTIFICATE_SAMPLES  # speculative decodes per prompt
    tokens: int = 3  # the first generated tokens, compared jointly
    temperature: float = 1.0
    false_alarm: float = 1e-3  # P(a lossless runtime fails the certificate), at most
    min_expected: float = 5.0  # outcomes expected fewer times than this share one bin
    batch_size: int = 100  # decodes per batched call

    def __post_init__(self) -> None:
        if min(self.prompts, self.samples, self.tokens, self.batch_size) < 1:
            raise ValueError("certificate prompts, samples, tokens and batch_size must be >= 1")
        if self.temperature <= 0:
            raise ValueError("the certificate samples: temperature must be > 0")
        if not 0 < self.false_alarm < 1:
            raise ValueError(f"false_alarm must be in (0, 1), got {self.false_alarm}")
        if self.min_expected <= 0:
            raise ValueError("min_expected must be > 0")


Outcome = tuple[int, ...]


@torch.no_grad()
def exact_bins(target, prompt: list[int], config: CertificateConfig, eos) -> dict[Outcome, float]:
    """The target's exact probability of every outcome it expects at least `min_expected`
    times in `samples` draws: L-token continuations, or shorter ones that end at EOS."""
    params = SamplingParams(temperature=config.temperature)
    floor = config.min_expected / config.samples
    device = next(target.parameters()).device
    bins: dict[Outcome, float] = {}
    frontier: list[tuple[Outcome, float]] = [((), 1.0)]
    for depth in range(config.tokens):
        grown: list[tuple[Outcome, float]] = []
        for start in range(0, len(frontier), 64):
            chunk = frontier[start : start + 64]
            ids = torch.tensor([prompt + list(prefix) for prefix, _ in chunk], device=device)
            probs = probabilities(target(input_ids=ids).logits[:, -1], params).cpu()
            for (prefix, mass), row in zip(chunk, probs, strict=True):
                joint = mass * row
                for token in torch.nonzero(joint >= floor).flatten().tolist():
                    outcome = (*prefix, token)
                    last = depth == config.tokens - 1
                    if last or token in eos:
                        bins[outcome] = joint[token].item()
                    else:
                        grown.append((outcome, joint[token].item()))
        frontier = grown
    return bins


def threshold(bins: Sequence[float], samples: int, delta: float) -> float:
    """The TV a lossless sampler exceeds with probability below `delta` (see the module)."""
    expected = 0.5 * sum(math.sqrt(p * (1 - p) / samples) for p in bins)
    return expected + math.sqrt(math.log(1 / delta) / (2 * samples))


def total_variation(counts: Counter, bins: dict[Outcome, float], samples: int) -> float:
    """TV between the empirical bin frequencies and the exact bin masses (rest included)."""
    rest = max(0.0, 1.0 - sum(bins.values()))
    tv = sum(abs(counts[outcome] / samples - p) for outcome, p in bins.items())
    return 0.5 * (tv + abs(counts[REST] / samples - rest))


def _sample_outcomes(
    generator: BatchGenerator, prompt: list[int], params: SamplingParams, config, bins
) -> tuple[Counter, int]:
    """`samples` speculative decodes of `prompt` binned, and the draft tokens they accepted."""
    counts: Counter = Counter()
    accepted = 0
    for number, start in enumerate(range(0, config.samples, config.batch_size)):
        rows = min(config.batch_size, config.samples - start)
        seeded = replace(params, max_new_tokens=config.tokens, seed=(params.seed or 0) + number)
        for out in generator.generate([prompt] * rows, seeded).outputs:
            outcome = tuple(out.token_ids[: config.tokens])
            counts[outcome if outcome in bins else REST] += 1
            accepted += out.metrics.num_accepted_tokens
    return counts, accepted


def certify(
    target,
    tokenizer,
    make_proposer: Callable,
    texts: Sequence[str | list[int]],
    config: CertificateConfig,
    acceptance: str = "exact",
    seed: int = 0,
    cache: CacheSettings = GROWING,
) -> dict[str, Any]:
    """Run the check on the first `config.prompts` of `texts`; the certificate as a dict
    (`cache`: decoded on the caches the evaluation served with)."""
    chosen = list(texts)[: config.prompts]
    delta = config.false_alarm / len(chosen)
    generator = BatchGenerator(
        target,
        tokenizer,
        make_proposer,
        num_speculative_tokens=config.tokens,
        max_speculative_batch=config.batch_size,
        cache=cache,
    )
    eos = eos_ids(target, tokenizer)
    rows = []
    for index, text in enumerate(chosen):
        prompt = encode_prompt(tokenizer, text, None)
        bins = exact_bins(target, prompt, config, eos)
        params = SamplingParams(
            temperature=config.temperature, seed=seed + 100_000 * index, acceptance=acceptance
        )
        counts, accepted = _sample_outcomes(generator, prompt, params, config, bins)
        tv = total_variation(counts, bins, config.samples)
        rest = max(0.0, 1.0 - sum(bins.values()))
        bound = threshold([*bins.values(), rest], config.samples, delta)
        rows.append(
            {
                "prompt": index + 1,
                "prompt_tokens": len(prompt),
                "bins": len(bins) + 1,
                "rest_mass": rest,
                "tv": tv,
                "threshold": bound,
                "accepted_drafts": accepted,
                "passed": tv <= bound,
            }
        )
    used = sum(r["accepted_drafts"] for r in rows) > 0
    return {
        "config": asdict(config),
        "acceptance": acceptance,
        "per_prompt": rows,
        "drafts_used": used,
        "max_tv_over_threshold": max(r["tv"] / r["threshold"] for r in rows),
        # a check in which no draft was ever accepted says nothing about the acceptance rule
        "passed": used and all(r["passed"] for r in rows),
    }


def describe(certificate: dict[str, Any] | None) -> str:
    """One line: what was checked and whether it passed."""
    if not certificate:
        return "no losslessness certificate"
    cfg = certificate["config"]
    rows = certificate["per_prompt"]
    verdict = "PASSED" if certificate["passed"] else "FAILED"
    worst = max(rows, key=lambda r: r["tv"] / r["threshold"])
    return (
        f"losslessness certificate {verdict}: {len(rows)} prompts x {cfg['samples']} sampled "
        f"decodes at T={cfg['temperature']:g}, first {cfg['tokens']} tokens, "
        f"{certificate['acceptance']} acceptance; worst TV {worst['tv']:.4f} vs threshold "
        f"{worst['threshold']:.4f}; false-alarm rate <= {cfg['false_alarm']:g}"
        + ("" if certificate["drafts_used"] else "; no draft was ever accepted")
    )


def headline(certificate: dict[str, Any]) -> dict[str, Any]:
    """The certificate's figures for the zoo index and the leaderboard."""
    cfg = certificate["config"]
    return {
        "passed": certificate["passed"],
        "drafts_used": certificate["drafts_used"],
        "prompts": len(certificate["per_prompt"]),
        "samples": cfg["samples"],
        "tokens": cfg["tokens"],
        "false_alarm": cfg["false_alarm"],
        "worst_tv_over_threshold": round(certificate["max_tv_over_threshold"], 3),
    }


def accept_every_draft(logits, proposal, params, generator, answer=None) -> tuple[list[int], int]:
    """A deliberately LOSSY acceptance rule, the control that shows the certificate's power
    (put in place of `draftzoo.inference.round.accept` by the tests and
    `bench/certificate_power.py`; the runtime never uses it): the proposal's first path kept
    whole, then a token sampled from the target (`answer`, a greedy round's argmax, unused:
    the certificate samples)."""
    path, slot = [], 0
    while proposal.children[slot]:
        child = proposal.children[slot][0]
        path.append(child)
        slot = child + 1
    return path, sample(probabilities(logits[slot], params), generator)
