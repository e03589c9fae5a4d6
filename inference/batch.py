"""Batched speculative decoding: one target forward per round for every unfinished request.

Rows are ragged: each keeps its own committed length, proposal and acceptance. The target's
KV cache is shared, [rows, heads, slots, dim]: a growing `DynamicCache` kept compact
(`growing_forward.py`), or with a static `cache` buffers allocated once whose decode-sized
forwards replay as CUDA graphs on CUDA (`static_forward.py`). Either way row r sees only its
own committed slots and its own tree, at its own positions, so a row's numbers never depend on
what the other rows do; finished rows are dropped. A batch of one prompt repeated (n samples
of it) prefills it once and repeats the cache.

Above `max_speculative_batch` unfinished rows the rounds propose nothing (plain batched
decoding in the same loop): at high batch the target forward is no longer overhead-bound and
speculation costs more than it saves. `bench/batch_bench.py` measures where that crossover
lies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..architectures.defaults import NUM_SPECULATIVE_TOKENS
from .acceptance import greedy_answers
from .cache_settings import GROWING, CacheSettings
from .errors import GenerationError
from .generate import fused_states, target_states
from .graphs import use_cuda_graphs
from .growing_forward import GrowingForward
from .proposer import Proposer
from .round import (
    GenerationOutput,
    Limits,
    Request,
    accept_round,
    commit,
    encode_prompt,
    eos_ids,
    output,
    propose,
    room,
)
from .sampling import SamplingParams
from .static_forward import StaticForward
from .transfer import to_device


@dataclass
class BatchOutput:
    """Per-request outputs (in prompt order) and the batch's wall time."""

    outputs: list[GenerationOutput]
    total_seconds: float
    num_rounds: int  # target forwards after prefill

    @property
    def tokens_per_second(self) -> float:
        tokens = sum(o.metrics.num_generated_tokens for o in self.outputs)
        return tokens / self.total_seconds if self.total_seconds > 0 else 0.0


class BatchGenerator:
    """Speculative decoding for a batch of prompts, per-row acceptance, lossless per row."""

    def __init__(
        self,
        target,
        tokenizer,
        proposer_factory: Callable[[], Proposer] | None = None,
        num_speculative_tokens: int = NUM_SPECULATIVE_TOKENS,
        max_speculative_batch: int = 8,
        cache: CacheSettings = GROWING,
    ) -> None:
        """`proposer_factory` makes one proposer per request (draft LMs keep per-row state).

        `cache`: the target's KV cache grows (default), or is kept in buffers allocated once
        (`CacheSettings(static=True)`: `max_length` positions per row, prompt and new tokens
        together, for as many rows as the largest batch asked for); on CUDA each (rows, width)
        forward then replays as a CUDA graph."""
        if num_speculative_tokens < 0 or max_speculative_batch < 0:
            raise GenerationError("num_speculative_tokens and max_speculative_batch must be >= 0")
        self.target, self.tokenizer = target.eval(), tokenizer
        self.proposer_factory = proposer_factory
        self.gamma = num_speculative_tokens
        self.max_speculative_batch = max_speculative_batch
        self.device = next(target.parameters()).device
        max_positions = getattr(target.config, "max_position_embeddings", None)
        self.vocab_size = target.get_input_embeddings().num_embeddings
        self.max_cache_length = cache.max_length if cache.static else None
        self.cuda_graphs = use_cuda_graphs(self.device, cache.cuda_graphs)
        self.kernels = cache.kernels_for(target)
        self._static: StaticForward | None = None
        limit = max_positions
        if self.max_cache_length is not None:
            limit = min(limit or self.max_cache_length, self.max_cache_length)
        self.limits = Limits(limit, eos_ids(target, tokenizer))

    @torch.no_grad()
    def generate(
        self, prompts: Sequence[str | list[int]], params: SamplingParams | None = None
    ) -> BatchOutput:
        """Generate a continuation of every prompt; outputs come back in prompt order."""
        params = params or SamplingParams()
        if not prompts:
            raise GenerationError("no prompts given")
        requests = []
        for prompt in prompts:
            ids = encode_prompt(self.tokenizer, prompt, self.limits.max_context, self.vocab_size)
            if self.max_cache_length and len(ids) + params.max_new_tokens > self.max_cache_length:
                raise GenerationError(
                    f"{len(ids)} prompt tokens + max_new_tokens {params.max_new_tokens} do not "
                    f"fit the static cache's {self.max_cache_length} positions "
                    "(raise the cache's max_length)"
                )
            proposer = self.proposer_factory() if self.proposer_factory else None
            if proposer is not None:
                proposer.reset()
            requests.append(Request(ids, proposer))
        with target_states(requests[0].proposer, self.target) as captured:
            return self._generate(requests, params, captured)

    def _forward(self, rows: int) -> GrowingForward | StaticForward:
        """The batched forward for `rows` requests: a growing cache, or the static buffers
        (allocated again, with their graphs, only when a larger batch comes)."""
        if self.max_cache_length is None:
            return GrowingForward(self.target, self.kernels)
        if self._static is None or self._static.max_rows < rows:
            self._static = None  # free the smaller buffers first
            self._static = StaticForward(
                self.target, self.max_cache_length, rows, self.cuda_graphs, kernels=self.kernels
            )
        return self._static

    def _observe(self, captured, request: Request, row: int, slots) -> None:
        """Hand `request`'s proposer the target states (forward row `row`) of its `slots`."""
        if captured is not None:
            proposer = request.proposer
            proposer.observe(fused_states(captured, proposer.target_layers)[row, slots])

    def _generate(self, requests: list[Request], params, captured) -> BatchOutput:
        generator = None if params.greedy else params.generator(self.device)
        started = time.perf_counter()
        forward = self._forward(len(requests))
        contexts = [r.context for r in requests]
        shared = len(requests) > 1 and all(c == contexts[0] for c in contexts)
        # one prompt asked for several times (n samples of it): prefilled once, cache repeated
        self._prefill(forward, contexts[:1] if shared else contexts, captured)
        if shared:
            forward.repeat(len(requests))
        for row, request in enumerate(requests):
            if len(request.context) > 1:
                prompt = slice(0, len(request.context) - 1)
                self._observe(captured, request, 0 if shared else row, prompt)
        prefill_seconds = time.perf_counter() - started
        active, rounds = list(range(len(requests))), 0
        while active:
            speculate = (
                self.proposer_factory is not None and len(active) <= self.max_speculative_batch
            )
            proposals = []
            for r in active:
                gamma = min(self.gamma, room(requests[r], params, self.limits) - 1)
                proposals.append(propose(requests[r], gamma if speculate else 0, params, generator))
            rows = [requests[r] for r in active]
            logits = self._verify(forward, rows, proposals, captured)
            rounds += 1
            # greedy: every row's answer and drafts in one host read
            answers = greedy_answers(logits, proposals) if params.greedy else [None] * len(rows)
            kept_rows, kept_slots = [], []
            for i, (request, proposal) in enumerate(zip(rows, proposals, strict=True)):
                logits_i = logits[i, : len(proposal) + 1]
                tokens, slots = accept_round(
                    logits_i, proposal, params, generator, request.metrics, answers[i]
                )
                self._observe(captured, request, i, slots)
                kept_slots.append(slots)
                if not commit(request, tokens, params, self.limits, self.tokenizer):
                    kept_rows.append(i)
                elif request.proposer is not None:
                    request.proposer.finish(request.context)
            active = [active[i] for i in kept_rows]
            if active:
                forward.commit(kept_slots)
                forward.keep_rows(kept_rows)
        total = time.perf_counter() - started
        for request in requests:
            request.metrics.prefill_seconds = prefill_seconds
            request.metrics.total_seconds = total
        return BatchOutput([output(r, params, self.tokenizer) for r in requests], total, rounds)

    def _prefill(self, forward, contexts: list[list[int]], captured) -> None:
        """Right-padded prompts (all but their last token) into the cache."""
        forward.reset(len(contexts))
        lengths = [len(c) - 1 for c in contexts]
        width = max(lengths)
        if width == 0:
            return
        ids = torch.zeros(len(contexts), width, dtype=torch.long)
        for r, context in enumerate(contexts):
            ids[r, : lengths[r]] = torch.tensor(context[:-1])
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        depths = torch.arange(width).repeat(len(contexts), 1)
        forward.forward(
            to_device(ids, self.device),
            depths,
            causal.repeat(len(contexts), 1, 1),
            captured,
            all_logits=False,
        )
        forward.commit([list(range(length)) for length in lengths])

    def _verify(self, forward, requests, proposals, captured) -> torch.Tensor:
        """One forward for all rows over [root, nodes...], right-padded to the longest row;
        logits [R, q, vocab] (the verification time is counted on every row). Drafts and tree
        layouts still on the device are laid out there, unread."""
        began = time.perf_counter()
        q = 1 + max(len(p) for p in proposals)
        inputs, depths = [], torch.zeros(len(proposals), q, dtype=torch.long)
        ancestors = torch.eye(q, dtype=torch.bool).repeat(len(proposals), 1, 1)  # padding: itself
        on_device = []
        for r, (request, proposal) in enumerate(zip(requests, proposals, strict=True)):
            n = len(proposal) + 1
            row = proposal.verification_input(request.context[-1], self.device)
            inputs.append(torch.nn.functional.pad(row, (0, q - n)))
            if proposal.tree_on_device:
                on_device.append((r, n, proposal))
                continue
            depths[r, 1:n] = torch.tensor(proposal.depths, dtype=torch.long)
            ancestors[r, :n, :n] = proposal.ancestor_mask()
        depths, ancestors = to_device(depths, self.device), to_device(ancestors, self.device)
        for r, n, proposal in on_device:
            depths[r, :n], ancestors[r, :n, :n] = proposal.layout(self.device)
        logits = forward.forward(torch.cat(inputs), depths, ancestors, captured)
        seconds = time.perf_counter() - began
        for request in requests:
            request.metrics.verify_seconds += seconds
        return logits
