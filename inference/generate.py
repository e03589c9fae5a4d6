"""The generate loop: propose -> verify -> accept -> commit, one target forward per round.

Target-only decoding is the same loop with an empty proposal every round, so speedups are
measured against the same runtime. The target's KV cache holds every committed token except
the last one (the *root*); a round feeds [root, draft nodes...] in one forward, with a tree
attention mask and depth-based positions when the proposal branches.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch

from .cache_settings import GROWING, CacheSettings
from .errors import GenerationError
from .growing_forward import GrowingForward
from .proposer import Proposer
from .round import (
    GenerationMetrics,
    GenerationOutput,
    Limits,
    Request,
    accept_round,
    commit,
    encode_prompt,
    eos_ids,
    out_of_room,
    output,
    propose,
    room,
)
from .sampling import SamplingParams
from .speculation_length import AdaptiveLength
from .static_forward import StaticForward
from .transfer import to_device

__all__ = [
    "GenerationMetrics",
    "GenerationOutput",
    "SpeculativeGenerator",
    "fused_states",
    "target_states",
]


def target_states(proposer, target):
    """A context that captures the target states `proposer` reads (its `target_layers`), or
    a no-op for proposers that read none. Yields {HF index: [b, s, h]}, refreshed per forward."""
    if proposer is None or not proposer.target_layers:
        return nullcontext(None)
    from ..architectures.target import TargetAdapter

    return TargetAdapter(target).capture(proposer.target_layers)


def fused_states(captured: dict, layers) -> torch.Tensor:
    """[b, s, k*h]: the captured states concatenated in the proposer's layer order."""
    return torch.cat([captured[layer] for layer in layers], dim=-1)


class SpeculativeGenerator:
    """Generates with a target model and an optional proposer (None = target-only decoding)."""

    def __init__(
        self,
        target,
        tokenizer,
        proposer: Proposer | None = None,
        num_speculative_tokens: int | AdaptiveLength | None = None,
        cache: CacheSettings = GROWING,
    ) -> None:
        """`num_speculative_tokens`: a fixed gamma, or None / an `AdaptiveLength` to choose
        gamma per round from the request's measured acceptance and draft/verify cost.

        `cache`: the target's KV cache grows with the context (default), or is kept in
        buffers allocated once (`CacheSettings(static=True, max_length=...)`), whose
        decode-sized forwards run as CUDA graphs on CUDA. Either way a request is the one-row
        case of batched decoding (`GrowingForward`, `StaticForward`)."""
        if isinstance(num_speculative_tokens, int) and num_speculative_tokens < 0:
            raise GenerationError("num_speculative_tokens must be >= 0")
        self.target = target.eval()
        self.tokenizer = tokenizer
        self.proposer = proposer
        self.speculation = (
            AdaptiveLength() if num_speculative_tokens is None else num_speculative_tokens
        )
        self.device = next(target.parameters()).device
        self.max_positions = getattr(target.config, "max_position_embeddings", None)
        self.vocab_size = target.get_input_embeddings().num_embeddings
        #: positions a request may fill in a static cache (None: the cache grows)
        self.max_cache_length = cache.max_length if cache.static else None
        kernels = cache.kernels_for(target)
        self.forward: GrowingForward | StaticForward = (
            StaticForward(target, cache.max_length, 1, cache.cuda_graphs, kernels=kernels)
            if cache.static
            else GrowingForward(target, kernels)
        )
        self.eos_ids = eos_ids(target, tokenizer)
        #: set by `draftzoo.load`: the loaded drafter (`inference.drafter_runtime.DrafterRuntime`)
        self.drafter = None

    def _limits(self) -> Limits:
        """The context a request may fill: the target's positions, or the static cache's."""
        limit = self.max_positions
        if self.max_cache_length is not None:
            limit = min(limit or self.max_cache_length, self.max_cache_length)
        return Limits(limit, self.eos_ids)

    @torch.no_grad()
    def generate(self, prompt: str | list[int], params: SamplingParams | None = None):
        """Generate a continuation of `prompt` (text or token ids)."""
        params = params or SamplingParams()
        prompt_ids = encode_prompt(self.tokenizer, prompt, self.max_positions, self.vocab_size)
        needed = len(prompt_ids) + params.max_new_tokens
        if self.max_cache_length is not None and needed > self.max_cache_length:
            raise GenerationError(
                f"{len(prompt_ids)} prompt tokens + max_new_tokens {params.max_new_tokens} do "
                f"not fit the static cache's {self.max_cache_length} positions "
                "(raise the cache's max_length)"
            )
        if self.proposer is not None:
            self.proposer.reset()
        if isinstance(self.speculation, AdaptiveLength):
            self.speculation.reset()
        generator = None if params.greedy else params.generator(self.device)
        request = Request(list(prompt_ids), self.proposer)
        started = time.perf_counter()
        with target_states(self.proposer, self.target) as captured:
            return self._generate(request, params, generator, started, captured)

    def _generate(self, request: Request, params, generator, started, captured):
        self._prefill(request.context, captured)
        request.metrics.prefill_seconds = time.perf_counter() - started
        limits = self._limits()
        request.finish = out_of_room(request, params, limits)
        while not request.finish:
            metrics = request.metrics
            draft_before, verify_before = metrics.draft_seconds, metrics.verify_seconds
            gamma = self._gamma(room(request, params, limits) - 1)
            proposal = propose(request, gamma, params, generator)
            new_tokens = self._verify_and_commit(
                request.context[-1], proposal, params, generator, metrics, captured
            )
            if isinstance(self.speculation, AdaptiveLength):
                self.speculation.observe(
                    drafted=max(proposal.depths, default=0),
                    accepted=len(new_tokens) - 1,
                    draft_seconds=metrics.draft_seconds - draft_before,
                    verify_seconds=metrics.verify_seconds - verify_before,
                )
            commit(request, new_tokens, params, limits, self.tokenizer)
        request.metrics.total_seconds = time.perf_counter() - started
        if self.proposer is not None:
            self.proposer.finish(request.context)
        return output(request, params, self.tokenizer)

    def _prefill(self, prompt_ids: list[int], captured) -> None:
        """The prompt but its last token into the target's cache (and its states to the
        proposer)."""
        self.forward.reset(1)
        if len(prompt_ids) > 1:
            prefill = to_device([prompt_ids[:-1]], self.device)
            self.forward.forward(prefill, None, None, captured, all_logits=False)
            self.forward.commit([list(range(prefill.shape[1]))])
            self._observe(captured, slice(None))

    def _gamma(self, room: int) -> int:
        if self.proposer is None:
            return 0
        if isinstance(self.speculation, AdaptiveLength):
            return self.speculation.choose(room)
        return min(self.speculation, room)

    def _observe(self, captured, slots) -> None:
        """Hand the proposer the target states of the committed positions `slots` (a slice,
        or the verified slots kept: a chain's are a prefix, read as a slice)."""
        if captured is not None:
            if isinstance(slots, list):
                prefix = slots == list(range(len(slots)))
                slots = slice(0, len(slots)) if prefix else to_device(slots, self.device)
            states = fused_states(captured, self.proposer.target_layers)[0, slots]
            self.proposer.observe(states)

    def _verify_and_commit(
        self, root, proposal, params, generator, metrics, captured=None
    ) -> list[int]:
        """One target forward over [root, nodes...]; the cache kept to the accepted path."""
        began = time.perf_counter()
        input_ids = proposal.verification_input(root, self.device)
        depths = ancestors = None  # a chain
        if not proposal.is_chain:
            depths, ancestors = proposal.layout(self.device)  # a device tree's own: no read
            depths, ancestors = depths[None], ancestors[None]
        logits = self.forward.forward(input_ids, depths, ancestors, captured)[0]
        held = self.forward.nbytes() + (
            self.proposer.cache_nbytes() if self.proposer is not None else 0
        )
        metrics.peak_cache_bytes = max(metrics.peak_cache_bytes, held)
        tokens, kept = accept_round(logits, proposal, params, generator, metrics)
        self.forward.commit([kept])
        self._observe(captured, kept)
        metrics.verify_seconds += time.perf_counter() - began
        return tokens
