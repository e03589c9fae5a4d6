"""The generate loop: propose -> verify -> accept -> commit, one target forward per round.

Target-only decoding is the same loop with an empty proposal every round, so speedups are
measured against the same runtime. The target's KV cache holds every committed token except
the last one (the *root*); a round feeds [root, draft nodes...] in one forward, with a tree
attention mask and depth-based positions when the proposal branches.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from .acceptance import accept
from .errors import GenerationError
from .kv_cache import cache_kwargs, cache_length, cache_nbytes, crop, keep_tail
from .proposers import Proposer
from .sampling import SamplingParams
from .speculation_length import AdaptiveLength
from .static_forward import StaticForward
from .tree import Proposal


@dataclass
class GenerationMetrics:
    """Counters of one generate call, named as vLLM names its spec-decode metrics."""

    num_generated_tokens: int = 0
    num_target_forwards: int = 0  # verification forwards (prefill excluded)
    num_drafts: int = 0  # rounds that proposed at least one token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    prefill_seconds: float = 0.0
    total_seconds: float = 0.0
    #: largest target KV cache (after a verification forward, tree nodes included) plus the
    #: proposer's own cache as it stands then (its real entries; drafts are already cropped)
    peak_cache_bytes: int = 0

    @property
    def mean_acceptance_length(self) -> float:
        """tau: tokens committed per target forward (correction/bonus token included)."""
        return self.num_generated_tokens / max(1, self.num_target_forwards)

    @property
    def draft_acceptance_rate(self) -> float:
        return self.num_accepted_tokens / max(1, self.num_draft_tokens)

    @property
    def acceptance_per_position(self) -> list[float]:
        """Share of drafting rounds whose k-th draft token was accepted."""
        return [n / max(1, self.num_drafts) for n in self.num_accepted_tokens_per_pos]

    @property
    def tokens_per_second(self) -> float:
        decode = self.total_seconds - self.prefill_seconds
        return self.num_generated_tokens / decode if decode > 0 else 0.0

    def summary(self) -> dict:
        """Plain numbers for printing and reports."""
        return {
            "num_generated_tokens": self.num_generated_tokens,
            "num_target_forwards": self.num_target_forwards,
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "draft_acceptance_rate": round(self.draft_acceptance_rate, 4),
            "acceptance_per_position": [round(x, 4) for x in self.acceptance_per_position],
            "draft_seconds": round(self.draft_seconds, 4),
            "verify_seconds": round(self.verify_seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "peak_cache_bytes": self.peak_cache_bytes,
        }


@dataclass
class GenerationOutput:
    """Generated token ids (prompt excluded), their text, and the call's metrics."""

    token_ids: list[int]
    text: str
    metrics: GenerationMetrics
    finish_reason: str  # "eos", "stop_string", "length" or "context"


def target_states(proposer, target):
    """A context that captures the target states `proposer` reads (its `target_layers`), or
    a no-op for proposers that read none. Yields {HF index: [b, s, h]}, refreshed per forward."""
    layers = getattr(proposer, "target_layers", None)
    if not layers:
        return nullcontext(None)
    from ..architectures.target import TargetAdapter

    return TargetAdapter(target).capture(layers)


def fused_states(captured: dict, layers) -> torch.Tensor:
    """[b, s, k*h]: the captured states concatenated in the proposer's layer order."""
    return torch.cat([captured[layer] for layer in layers], dim=-1)


def _tree_mask(proposal: Proposal, past: int, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, n+1, past+n+1] additive mask: all past positions, then ancestors in the tree."""
    ancestors = proposal.ancestor_mask()
    allowed = torch.cat([torch.ones(len(ancestors), past, dtype=torch.bool), ancestors], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def tree_forward_kwargs(proposal: Proposal, past: int, dtype: torch.dtype, device) -> dict:
    """Position ids and attention mask of a verification forward over [root, nodes...] after
    `past` cached positions; none for a chain (the model's own causal layout)."""
    if proposal.is_chain:
        return {}
    depths = torch.tensor([0, *proposal.depths], device=device)
    return {
        "position_ids": (past + depths)[None],
        "attention_mask": _tree_mask(proposal, past, dtype).to(device),
    }


class SpeculativeGenerator:
    """Generates with a target model and an optional proposer (None = target-only decoding)."""

    def __init__(
        self,
        target,
        tokenizer,
        proposer: Proposer | None = None,
        num_speculative_tokens: int | AdaptiveLength | None = None,
        static_cache: bool = False,
        max_cache_length: int = 2048,
        cuda_graphs: bool | None = None,
    ) -> None:
        """`num_speculative_tokens`: a fixed gamma, or None / an `AdaptiveLength` to choose
        gamma per round from the request's measured acceptance and draft/verify cost.

        `static_cache`: keep the target's KV cache in buffers allocated once
        (`max_cache_length` positions, prompt and new tokens together) instead of a growing
        `DynamicCache`; on CUDA its decode-sized forwards then run as CUDA graphs
        (`cuda_graphs`: None = on when the target is on CUDA; see `static_forward.py`)."""
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
        self.static = StaticForward(target, max_cache_length, cuda_graphs) if static_cache else None
        self.eos_ids = self._eos_ids()
        #: set by `draftzoo.load`: the loaded drafter (`inference.load.DrafterRuntime`)
        self.drafter = None

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        generation_config = getattr(self.target, "generation_config", None)
        configured = getattr(generation_config, "eos_token_id", None)
        if configured is not None:
            ids.update(configured if isinstance(configured, list) else [configured])
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    def _encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise GenerationError("the prompt is empty")
            ids = self.tokenizer(prompt, add_special_tokens=False).input_ids
        else:
            ids = list(prompt)
        if not ids:
            raise GenerationError("the prompt is empty")
        if self.max_positions is not None and len(ids) >= self.max_positions:
            raise GenerationError(
                f"the prompt has {len(ids)} tokens; the target's context is "
                f"{self.max_positions} positions, which leaves no room to generate"
            )
        return ids

    @torch.no_grad()
    def generate(self, prompt: str | list[int], params: SamplingParams | None = None):
        """Generate a continuation of `prompt` (text or token ids)."""
        params = params or SamplingParams()
        prompt_ids = self._encode(prompt)
        if self.static is not None and len(prompt_ids) + params.max_new_tokens > (
            self.static.max_length
        ):
            raise GenerationError(
                f"{len(prompt_ids)} prompt tokens + max_new_tokens {params.max_new_tokens} do "
                f"not fit the static cache's {self.static.max_length} positions "
                "(raise max_cache_length)"
            )
        if hasattr(self.proposer, "reset"):
            self.proposer.reset()
        if isinstance(self.speculation, AdaptiveLength):
            self.speculation.reset()
        generator = None if params.greedy else params.generator(self.device)
        metrics = GenerationMetrics()
        started = time.perf_counter()

        with target_states(self.proposer, self.target) as captured:
            return self._generate(prompt_ids, params, generator, metrics, started, captured)

    def _generate(self, prompt_ids, params, generator, metrics, started, captured):
        from transformers import DynamicCache

        cache = None if self.static else DynamicCache()  # filled in place by every forward
        if self.static:
            self.static.reset()
        if len(prompt_ids) > 1:
            prefill = torch.tensor([prompt_ids[:-1]], device=self.device)
            if self.static:
                self.static.forward(prefill, captured=captured)
                self.static.commit(list(range(prefill.shape[1])))
            else:
                self.target(input_ids=prefill, **cache_kwargs(self.target, cache, True))
            self._observe(captured, slice(None))
        metrics.prefill_seconds = time.perf_counter() - started

        context = list(prompt_ids)
        generated: list[int] = []
        finish = "length"
        while True:
            room = params.max_new_tokens - len(generated)
            if self.max_positions is not None:
                room = min(room, self.max_positions - len(context))
            if self.static:
                room = min(room, self.static.max_length - len(context))
            if room <= 0:
                finish = "length" if len(generated) >= params.max_new_tokens else "context"
                break
            draft_before, verify_before = metrics.draft_seconds, metrics.verify_seconds
            proposal = self._propose(context, self._gamma(room - 1), params, generator, metrics)
            new_tokens = self._verify_and_commit(
                context[-1], proposal, cache, params, generator, metrics, captured
            )
            if isinstance(self.speculation, AdaptiveLength):
                self.speculation.observe(
                    drafted=max(proposal.depths, default=0),
                    accepted=len(new_tokens) - 1,
                    draft_seconds=metrics.draft_seconds - draft_before,
                    verify_seconds=metrics.verify_seconds - verify_before,
                )
            finish = self._extend(generated, context, new_tokens, params)
            if finish:
                break
        metrics.total_seconds = time.perf_counter() - started
        metrics.num_generated_tokens = len(generated)
        text = self.tokenizer.decode(generated) if self.tokenizer is not None else ""
        if finish == "stop_string":
            text = _cut_at_stop(text, params.stop_strings)
        return GenerationOutput(generated, text, metrics, finish)

    def _gamma(self, room: int) -> int:
        if self.proposer is None:
            return 0
        if isinstance(self.speculation, AdaptiveLength):
            return self.speculation.choose(room)
        return min(self.speculation, room)

    def _propose(self, context, max_tokens, params, generator, metrics) -> Proposal:
        if self.proposer is None or max_tokens <= 0:
            return Proposal.chain([])
        began = time.perf_counter()
        proposal = self.proposer.propose(context, max_tokens, params, generator)
        metrics.draft_seconds += time.perf_counter() - began
        if len(proposal):
            metrics.num_drafts += 1
            metrics.num_draft_tokens += len(proposal)
        return proposal

    def _observe(self, captured, slots) -> None:
        """Hand the proposer the target states of the committed positions `slots`."""
        if captured is not None:
            states = fused_states(captured, self.proposer.target_layers)[0, slots]
            self.proposer.observe(states)

    def _verify_and_commit(
        self, root, proposal, cache, params, generator, metrics, captured=None
    ) -> list[int]:
        """One target forward over [root, nodes...]; roll the cache to the accepted path."""
        began = time.perf_counter()
        input_ids = torch.tensor([[root, *proposal.tokens]], device=self.device)
        past = self.static.length if self.static else cache_length(cache)
        if self.static:
            logits = self._static_verify(input_ids, proposal, captured)
        else:
            logits = self._dynamic_verify(input_ids, proposal, cache, past)
        held = self._target_cache_bytes(cache) + getattr(self.proposer, "cache_nbytes", lambda: 0)()
        metrics.peak_cache_bytes = max(metrics.peak_cache_bytes, held)
        accepted, next_token = accept(logits, proposal, params, generator)
        kept = [0] + [node + 1 for node in accepted]
        if self.static:
            self.static.commit(kept)
        elif proposal.is_chain:
            crop(cache, past + len(kept))
        else:
            keep_tail(cache, past, kept)
        self._observe(captured, kept)
        metrics.verify_seconds += time.perf_counter() - began
        metrics.num_target_forwards += 1
        metrics.num_accepted_tokens += len(accepted)
        if len(proposal):
            depth = len(accepted)
            per_pos = metrics.num_accepted_tokens_per_pos
            per_pos.extend([0] * (max(proposal.depths) - len(per_pos)))
            for k in range(depth):
                per_pos[k] += 1
        return [proposal.tokens[node] for node in accepted] + [next_token]

    def _dynamic_verify(self, input_ids, proposal, cache, past) -> torch.Tensor:
        kwargs = tree_forward_kwargs(proposal, past, self.target.dtype, self.device)
        out = self.target(input_ids=input_ids, **cache_kwargs(self.target, cache), **kwargs)
        return out.logits[0]

    def _static_verify(self, input_ids, proposal, captured) -> torch.Tensor:
        if proposal.is_chain:
            return self.static.forward(input_ids, captured=captured)
        depths = torch.tensor([0, *proposal.depths], device=self.device)
        return self.static.forward(input_ids, proposal.ancestor_mask(), depths, captured)

    def _target_cache_bytes(self, cache) -> int:
        """The target's KV bytes after a verification forward, its nodes included (a static
        cache: its whole preallocated buffers)."""
        if self.static:
            return self.static.nbytes()
        return cache_nbytes(cache)

    def _extend(self, generated, context, new_tokens, params) -> str:
        """Commit tokens up to EOS / the length cap; return the finish reason or ''."""
        for token in new_tokens:
            generated.append(token)
            context.append(token)
            if token in self.eos_ids:
                return "eos"
            if len(generated) >= params.max_new_tokens:
                return "length"
        if params.stop_strings and self.tokenizer is not None:
            tail = self.tokenizer.decode(generated[-(len(new_tokens) + 16) :])
            if any(stop in tail for stop in params.stop_strings):
                return "stop_string"
        return ""


def _cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    cut = min((text.find(s) + len(s) for s in stops if s in text), default=len(text))
    return text[:cut]
