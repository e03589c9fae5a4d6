"""Batched speculative decoding: one target forward per round for every unfinished request.

Rows are ragged: each keeps its own committed length, proposal and acceptance. The target's
KV cache is shared, [rows, heads, slots, dim], and kept *compact*: after every round each row's
valid slots are gathered to the front (its committed tokens minus the root), finished rows are
dropped, and the next round's attention mask lets row r see slots [0, len_r) plus its own new
tree. Positions are per row. So a row's numbers never depend on what the other rows do.
A batch of one prompt repeated (n samples of it) prefills it once and repeats the cache.

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
from .errors import GenerationError
from .generate import fused_states, target_states
from .kv_cache import _layers, cache_kwargs
from .proposers import Proposer
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
from .tree import Proposal


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


def _gather_cache(cache, rows: torch.Tensor, slots: torch.Tensor) -> None:
    """Keep cache rows `rows` [R] and, per kept row, slots `slots` [R, W] (in that order)."""
    for layer in _layers(cache):
        keys, values = layer.keys[rows], layer.values[rows]
        index = slots.to(keys.device)[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
        layer.keys = torch.gather(keys, 2, index)
        layer.values = torch.gather(values, 2, index)


def _round_mask(
    lengths: list[int], proposals: list[Proposal], width: int, dtype: torch.dtype
) -> torch.Tensor:
    """[R, 1, q, width + q] additive mask: each row's valid past, then its own tree."""
    rows, q = len(proposals), 1 + max(len(p) for p in proposals)
    allowed = torch.zeros(rows, q, width + q, dtype=torch.bool)
    for r, (length, proposal) in enumerate(zip(lengths, proposals, strict=True)):
        n = len(proposal) + 1
        allowed[r, :n, :length] = True
        allowed[r, :n, width : width + n] = proposal.ancestor_mask()
        for pad in range(n, q):  # padding queries see only themselves
            allowed[r, pad, width + pad] = True
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


class BatchGenerator:
    """Speculative decoding for a batch of prompts, per-row acceptance, lossless per row."""

    def __init__(
        self,
        target,
        tokenizer,
        proposer_factory: Callable[[], Proposer] | None = None,
        num_speculative_tokens: int = NUM_SPECULATIVE_TOKENS,
        max_speculative_batch: int = 8,
    ) -> None:
        """`proposer_factory` makes one proposer per request (draft LMs keep per-row state)."""
        if num_speculative_tokens < 0 or max_speculative_batch < 0:
            raise GenerationError("num_speculative_tokens and max_speculative_batch must be >= 0")
        self.target, self.tokenizer = target.eval(), tokenizer
        self.proposer_factory = proposer_factory
        self.gamma = num_speculative_tokens
        self.max_speculative_batch = max_speculative_batch
        self.device = next(target.parameters()).device
        max_positions = getattr(target.config, "max_position_embeddings", None)
        self.limits = Limits(max_positions, eos_ids(target, tokenizer))

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
            ids = encode_prompt(self.tokenizer, prompt, self.limits.max_context)
            proposer = self.proposer_factory() if self.proposer_factory else None
            if proposer is not None:
                proposer.reset()
            requests.append(Request(ids, proposer))
        with target_states(requests[0].proposer, self.target) as captured:
            return self._generate(requests, params, captured)

    def _observe(self, captured, request: Request, row: int, slots) -> None:
        """Hand `request`'s proposer the target states (cache row `row`) of its `slots`."""
        if captured is not None:
            proposer = request.proposer
            proposer.observe(fused_states(captured, proposer.target_layers)[row, slots])

    def _generate(self, requests: list[Request], params, captured) -> BatchOutput:
        from transformers import DynamicCache

        generator = None if params.greedy else params.generator(self.device)
        started = time.perf_counter()
        cache = DynamicCache()
        lengths = [len(r.context) - 1 for r in requests]  # cache slots per row (all but the root)
        contexts = [r.context for r in requests]
        shared = len(requests) > 1 and all(c == contexts[0] for c in contexts)
        # one prompt asked for several times (n samples of it): prefilled once, cache repeated
        self._prefill(cache, *((contexts[:1], lengths[:1]) if shared else (contexts, lengths)))
        if shared and lengths[0] > 0:
            cache.batch_repeat_interleave(len(requests))
        if max(lengths) > 0:
            for row, request in enumerate(requests):
                self._observe(captured, request, 0 if shared else row, slice(0, lengths[row]))
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
            width = cache.get_seq_length()  # new slots start here
            rows = [requests[r] for r in active]
            verified = self._verify(cache, [lengths[r] for r in active], rows, proposals)
            rounds += 1
            keep_rows, keep_slots = [], []
            for i, (r, request) in enumerate(zip(active, rows, strict=True)):
                tokens, slots = accept_round(
                    verified[i], proposals[i], params, generator, request.metrics
                )
                self._observe(captured, request, i, slots)
                if commit(request, tokens, params, self.limits, self.tokenizer):
                    continue
                keep_rows.append(i)
                keep_slots.append(list(range(lengths[r])) + [width + s for s in slots])
                lengths[r] = len(keep_slots[-1])
            active = [active[i] for i in keep_rows]
            if active:
                wide = max(len(s) for s in keep_slots)
                padded = [s + [0] * (wide - len(s)) for s in keep_slots]
                _gather_cache(cache, torch.tensor(keep_rows), torch.tensor(padded))
        total = time.perf_counter() - started
        for request in requests:
            request.metrics.prefill_seconds = prefill_seconds
            request.metrics.total_seconds = total
        return BatchOutput([output(r, params, self.tokenizer) for r in requests], total, rounds)

    def _prefill(self, cache, contexts, lengths) -> None:
        """Right-padded prompts (all but their last token) into the cache."""
        width = max(lengths)
        if width == 0:
            return
        ids = torch.zeros(len(contexts), width, dtype=torch.long)
        for r, context in enumerate(contexts):
            ids[r, : lengths[r]] = torch.tensor(context[:-1])
        causal = torch.tril(torch.ones(width, width, dtype=torch.bool))
        allowed = torch.zeros(len(contexts), width, width, dtype=torch.bool)
        for r, length in enumerate(lengths):
            allowed[r, :length, :length] = causal[:length, :length]
            allowed[r, range(length, width), range(length, width)] = True  # padding: itself
        mask = torch.zeros(allowed.shape, dtype=self.target.dtype)
        mask.masked_fill_(~allowed, torch.finfo(mask.dtype).min)
        mask = mask[:, None]
        positions = torch.arange(width)[None].expand(len(contexts), -1)
        self.target(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            **cache_kwargs(self.target, cache, True),
        )

    def _verify(self, cache, lengths, requests, proposals) -> list[torch.Tensor]:
        """One forward for all rows over [root, nodes...]; each row's logits [n + 1, vocab]
        (its verification time is counted on every row)."""
        began = time.perf_counter()
        width = cache.get_seq_length()
        q = 1 + max(len(p) for p in proposals)
        ids = torch.zeros(len(proposals), q, dtype=torch.long)
        positions = torch.zeros(len(proposals), q, dtype=torch.long)
        for r, (request, proposal) in enumerate(zip(requests, proposals, strict=True)):
            ids[r, : len(proposal) + 1] = torch.tensor([request.context[-1], *proposal.tokens])
            positions[r] = lengths[r]
            positions[r, 1 : len(proposal) + 1] += torch.tensor(proposal.depths, dtype=torch.long)
        mask = _round_mask(lengths, proposals, width, self.target.dtype)
        out = self.target(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            **cache_kwargs(self.target, cache),
        )
        seconds = time.perf_counter() - began
        for request in requests:
            request.metrics.verify_seconds += seconds
        return [out.logits[r, : len(p) + 1] for r, p in enumerate(proposals)]
