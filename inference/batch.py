"""Batched speculative decoding: one target forward per round for every unfinished request.

Rows are ragged: each keeps its own committed length, proposal and acceptance. The target's
KV cache is shared, [rows, heads, slots, dim], and kept *compact*: after every round each row's
valid slots are gathered to the front (its committed tokens minus the root), finished rows are
dropped, and the next round's attention mask lets row r see slots [0, len_r) plus its own new
tree. Positions are per row. So a row's numbers never depend on what the other rows do.

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

from .acceptance import accept
from .errors import GenerationError
from .generate import (
    GenerationMetrics,
    GenerationOutput,
    SpeculativeGenerator,
    _cut_at_stop,
    fused_states,
    target_states,
)
from .kv_cache import _layers, cache_kwargs
from .proposers import Proposer
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
        num_speculative_tokens: int = 4,
        max_speculative_batch: int = 8,
    ) -> None:
        """`proposer_factory` makes one proposer per request (draft LMs keep per-row state)."""
        if num_speculative_tokens < 0 or max_speculative_batch < 0:
            raise GenerationError("num_speculative_tokens and max_speculative_batch must be >= 0")
        self.single = SpeculativeGenerator(target, tokenizer)  # shared helpers: encode, EOS
        self.target, self.tokenizer = self.single.target, tokenizer
        self.proposer_factory = proposer_factory
        self.gamma = num_speculative_tokens
        self.max_speculative_batch = max_speculative_batch
        self.device = self.single.device

    @torch.no_grad()
    def generate(
        self, prompts: Sequence[str | list[int]], params: SamplingParams | None = None
    ) -> BatchOutput:
        """Generate a continuation of every prompt; outputs come back in prompt order."""
        params = params or SamplingParams()
        if not prompts:
            raise GenerationError("no prompts given")
        contexts = [self.single._encode(p) for p in prompts]
        proposers = [self.proposer_factory() if self.proposer_factory else None for _ in prompts]
        for proposer in proposers:
            if hasattr(proposer, "reset"):
                proposer.reset()
        with target_states(proposers[0], self.target) as captured:
            return self._generate(contexts, proposers, params, captured)

    def _observe(self, captured, proposers, row: int, rows: list[int], slots) -> None:
        """Hand request `rows[row]`'s proposer the target states of its committed `slots`."""
        if captured is not None:
            proposer = proposers[rows[row]]
            proposer.observe(fused_states(captured, proposer.target_layers)[row, slots])

    def _generate(self, contexts, proposers, params, captured) -> BatchOutput:
        from transformers import DynamicCache

        generator = None if params.greedy else params.generator(self.device)
        metrics = [GenerationMetrics() for _ in contexts]
        generated: list[list[int]] = [[] for _ in contexts]
        finish = [""] * len(contexts)
        started = time.perf_counter()

        cache = DynamicCache()
        active = list(range(len(contexts)))
        lengths = [len(c) - 1 for c in contexts]  # cache slots per row (all but the root)
        self._prefill(cache, contexts, lengths)
        if max(lengths) > 0:
            for r in active:
                self._observe(captured, proposers, r, active, slice(0, lengths[r]))
        prefill_seconds = time.perf_counter() - started
        rounds = 0
        while active:
            speculate = (
                self.proposer_factory is not None and len(active) <= self.max_speculative_batch
            )
            proposals = []
            for r in active:
                room = self._room(params, generated[r], contexts[r]) - 1
                gamma = min(self.gamma, room) if speculate else 0
                proposals.append(
                    self._propose(proposers[r], contexts[r], gamma, params, generator, metrics[r])
                )
            width = cache.get_seq_length()  # new slots start here
            new_tokens = self._verify(
                cache,
                [lengths[r] for r in active],
                [contexts[r][-1] for r in active],
                proposals,
                params,
                generator,
                [metrics[r] for r in active],
            )
            rounds += 1
            keep_rows, keep_slots = [], []
            for i, r in enumerate(active):
                tokens, slots = new_tokens[i]
                self._observe(captured, proposers, i, active, slots)
                finish[r] = self.single._extend(generated[r], contexts[r], tokens, params)
                if not finish[r] and self._room(params, generated[r], contexts[r]) <= 0:
                    finish[r] = (
                        "length" if len(generated[r]) >= params.max_new_tokens else "context"
                    )
                if finish[r]:
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
        outputs = []
        for r in range(len(contexts)):
            metrics[r].num_generated_tokens = len(generated[r])
            metrics[r].prefill_seconds = prefill_seconds
            metrics[r].total_seconds = total
            text = self.tokenizer.decode(generated[r]) if self.tokenizer is not None else ""
            if finish[r] == "stop_string":
                text = _cut_at_stop(text, params.stop_strings)
            outputs.append(GenerationOutput(generated[r], text, metrics[r], finish[r]))
        return BatchOutput(outputs, total, rounds)

    def _room(self, params, generated, context) -> int:
        room = params.max_new_tokens - len(generated)
        if self.single.max_positions is not None:
            room = min(room, self.single.max_positions - len(context))
        return room

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

    def _propose(self, proposer, context, gamma, params, generator, metrics) -> Proposal:
        if proposer is None or gamma <= 0:
            return Proposal.chain([])
        began = time.perf_counter()
        proposal = proposer.propose(context, gamma, params, generator)
        metrics.draft_seconds += time.perf_counter() - began
        if len(proposal):
            metrics.num_drafts += 1
            metrics.num_draft_tokens += len(proposal)
        return proposal

    def _verify(self, cache, lengths, roots, proposals, params, generator, metrics):
        """One forward for all rows; per row: (committed tokens, their new-slot offsets)."""
        began = time.perf_counter()
        width = cache.get_seq_length()
        q = 1 + max(len(p) for p in proposals)
        ids = torch.zeros(len(proposals), q, dtype=torch.long)
        positions = torch.zeros(len(proposals), q, dtype=torch.long)
        for r, (root, proposal) in enumerate(zip(roots, proposals, strict=True)):
            ids[r, : len(proposal) + 1] = torch.tensor([root, *proposal.tokens])
            positions[r] = lengths[r]
            positions[r, 1 : len(proposal) + 1] += torch.tensor(proposal.depths, dtype=torch.long)
        mask = _round_mask(lengths, proposals, width, self.target.dtype)
        out = self.target(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            **cache_kwargs(self.target, cache),
        )
        results = []
        seconds = time.perf_counter() - began
        for r, proposal in enumerate(proposals):
            logits = out.logits[r, : len(proposal) + 1]
            accepted, next_token = accept(logits, proposal, params, generator)
            row = metrics[r]
            row.verify_seconds += seconds
            row.num_target_forwards += 1
            row.num_accepted_tokens += len(accepted)
            if len(proposal):
                per_pos = row.num_accepted_tokens_per_pos
                per_pos.extend([0] * (max(proposal.depths) - len(per_pos)))
                for k in range(len(accepted)):
                    per_pos[k] += 1
            tokens = [proposal.tokens[node] for node in accepted] + [next_token]
            results.append((tokens, [0] + [node + 1 for node in accepted]))
        return results
