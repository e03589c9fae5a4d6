"""Sampling settings and the distribution they turn logits into (applied to p and q alike)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..architectures.config_io import check_seed
from ..architectures.defaults import MAX_NEW_TOKENS, TEMPERATURE
from .errors import GenerationError

#: how draft tokens are accepted; only "exact" is lossless
ACCEPTANCES = ("exact", "typical")


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen. temperature 0 means greedy."""

    temperature: float = TEMPERATURE  # 0 = greedy argmax; > 0 samples from softmax(logits / T)
    top_k: int = 0  # keep the k most likely tokens; 0 = all
    top_p: float = 1.0  # keep the smallest set with this much mass; 1 = all
    max_new_tokens: int = MAX_NEW_TOKENS  # hard cap on generated tokens
    stop_strings: tuple[str, ...] = ()  # stop once the decoded output contains one
    seed: int | None = None  # seeds the sampler's generator; None = nondeterministic
    #: "exact": lossless acceptance (the output is distributed as the target's); "typical":
    #: Medusa's typical acceptance, LOSSY at T > 0 (tokens the target finds typical enough are
    #: kept: p(x) > min(typical_threshold, typical_alpha x exp(-entropy of p)))
    acceptance: str = "exact"
    typical_threshold: float = 0.09  # Medusa's posterior_threshold (epsilon)
    typical_alpha: float = 0.3  # Medusa's posterior_alpha (delta)

    def __post_init__(self) -> None:
        if self.seed is not None:  # torch's generator takes a signed 64-bit integer
            check_seed(self.seed, "seed", GenerationError, limit=2**63)
        if self.acceptance not in ACCEPTANCES:
            raise GenerationError(
                f"acceptance must be one of {ACCEPTANCES}, got {self.acceptance!r}"
            )
        if not 0 < self.typical_threshold < 1 or not 0 < self.typical_alpha <= 1:
            raise GenerationError("typical_threshold must be in (0, 1), typical_alpha in (0, 1]")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise GenerationError(f"temperature must be >= 0 and finite, got {self.temperature}")
        if self.top_k < 0:
            raise GenerationError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise GenerationError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def lossy(self) -> bool:
        """Typical acceptance when sampling: the output is not distributed as the target's."""
        return self.acceptance == "typical" and not self.greedy

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """A torch generator seeded from `seed` (or randomly)."""
        gen = torch.Generator(device=device)
        if self.seed is None:
            gen.seed()
        else:
            gen.manual_seed(self.seed)
        return gen


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The sampling distribution over the last dim: temperature, then top-k, then top-p.

    Greedy settings give the one-hot distribution of the argmax, so greedy decoding is the
    T -> 0 limit of the same rule.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def is_distribution(probs: torch.Tensor) -> torch.Tensor:
    """Per row of `probs` [..., vocab]: finite, non-negative, with mass (a drafter with
    broken weights gives rows that are not)."""
    return torch.isfinite(probs).all(-1) & (probs >= 0).all(-1) & (probs.sum(-1) > 0)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id from a 1-D distribution (need not sum to 1), by inverting its CDF with one
    uniform draw (on CPU several times cheaper than `torch.multinomial`, which draws one
    exponential per token). A zero-probability token is never returned."""
    cdf = probs.float().cumsum(0)
    total = cdf[-1]
    if not total > 0:
        raise GenerationError("cannot sample from a distribution with no mass")
    point = torch.rand((), generator=generator, device=probs.device) * total
    index = int(torch.searchsorted(cdf, point, right=True))
    if index >= len(cdf):  # point rounded up onto the total: the last token with mass
        index = int(probs.nonzero()[-1])
    return index


def gumbel_argmax(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of `probs` [..., V] (each row a distribution), drawn on its device
    without a host read (`gumbel_pick` with fresh uniforms)."""
    uniforms = torch.rand(probs.shape, generator=generator, device=probs.device)
    return gumbel_pick(probs, uniforms)


def gumbel_pick(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """argmax(log p + Gumbel noise made from `uniforms`, same shape): distributed as p, and a
    zero-probability token (log 0 = -inf) is never picked. Uniforms drawn before a CUDA graph
    replay keep the draw exact and the graph free of a generator."""
    gumbel = -(-uniforms.clamp_min(1e-20).log()).log()
    return (probs.log() + gumbel).argmax(-1)
