"""One decode round, as pure steps that batch-1 and batched generation both run.

    propose(request, ...)       -> Proposal          (the proposer drafts; draft time counted)
    <target forward>            -> logits            (each loop's own: one row, or all rows)
    accept_round(logits, ...)   -> tokens, slots     (lossless acceptance; counters updated)
    commit(request, tokens, ...)-> finish reason     (EOS, length, stop string, full context)

A `Request` holds what one prompt carries across rounds: its committed tokens, its proposer,
its metrics and, once set, why it finished.
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field

import torch

from .acceptance import accept
from .errors import GenerationError
from .proposer import Proposer
from .sampling import SamplingParams
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


@dataclass
class Request:
    """One prompt's state across rounds."""

    context: list[int]  # every committed token, prompt included
    proposer: Proposer | None
    metrics: GenerationMetrics = field(default_factory=GenerationMetrics)
    generated: list[int] = field(default_factory=list)
    finish: str = ""  # "" while it runs


@dataclass(frozen=True)
class Limits:
    """What ends a request besides its own tokens: the context it may fill, its EOS ids."""

    max_context: int | None  # positions the target (or its static cache) holds
    eos_ids: frozenset[int]


def token_ids(prompt) -> list[int]:
    """A prompt given as token ids (a list, tuple, array or tensor of integers) as a list of
    ints; anything else is refused in one line."""
    try:
        items = list(prompt)
    except TypeError:
        raise GenerationError(
            f"a prompt is text or a list of token ids, not {type(prompt).__name__}"
        ) from None
    ids = []
    for item in items:
        try:
            if isinstance(item, bool):
                raise TypeError
            ids.append(operator.index(item))
        except TypeError:
            raise GenerationError(f"a prompt of token ids holds {item!r}, not a token id") from None
    return ids


def encode_prompt(
    tokenizer, prompt: str | list[int], max_positions: int | None, vocab_size: int | None = None
) -> list[int]:
    """Token ids of a prompt (text, or ids below `vocab_size`); an empty one, one that fills
    the context, or ids that are not the target's tokens are refused."""
    if isinstance(prompt, str):
        if not prompt:
            raise GenerationError("the prompt is empty")
        ids = tokenizer(prompt, add_special_tokens=False).input_ids
    else:
        ids = token_ids(prompt)
        outside = [i for i in ids if i < 0 or (vocab_size is not None and i >= vocab_size)]
        if outside:
            raise GenerationError(
                f"token id {outside[0]} is outside the target's vocabulary (0..{vocab_size - 1})"
                if vocab_size is not None
                else f"token id {outside[0]} is negative"
            )
    if not ids:
        raise GenerationError("the prompt is empty")
    if max_positions is not None and len(ids) >= max_positions:
        raise GenerationError(
            f"the prompt has {len(ids)} tokens; the target's context is "
            f"{max_positions} positions, which leaves no room to generate"
        )
    return ids


def eos_ids(target, tokenizer) -> frozenset[int]:
    """The target's generation-config EOS ids and the tokenizer's own."""
    ids: set[int] = set()
    generation_config = getattr(target, "generation_config", None)
    configured = getattr(generation_config, "eos_token_id", None)
    if configured is not None:
        ids.update(configured if isinstance(configured, list) else [configured])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def room(request: Request, params: SamplingParams, limits: Limits) -> int:
    """Tokens the request may still commit."""
    left = params.max_new_tokens - len(request.generated)
    if limits.max_context is not None:
        left = min(left, limits.max_context - len(request.context))
    return left


def out_of_room(request: Request, params: SamplingParams, limits: Limits) -> str:
    """ "length" or "context" when the request may commit nothing more, else ""."""
    if room(request, params, limits) > 0:
        return ""
    return "length" if len(request.generated) >= params.max_new_tokens else "context"


def propose(request: Request, max_tokens: int, params, generator) -> Proposal:
    """The request's proposal of at most `max_tokens` (an empty chain without a proposer)."""
    if request.proposer is None or max_tokens <= 0:
        return Proposal.chain([])
    began = time.perf_counter()
    proposal = request.proposer.propose(request.context, max_tokens, params, generator)
    request.metrics.draft_seconds += time.perf_counter() - began
    if len(proposal):
        request.metrics.num_drafts += 1
        request.metrics.num_draft_tokens += len(proposal)
    return proposal


def accept_round(
    logits: torch.Tensor,
    proposal: Proposal,
    params,
    generator,
    metrics: GenerationMetrics,
    answer: list[int] | None = None,
) -> tuple[list[int], list[int]]:
    """Accept along the tree from the target's logits over [root, nodes...] (greedy: or its
    argmax per slot, `answer`, read already); count the round.

    Returns (committed tokens: the accepted path then the target's own token, the slots of
    the root and the accepted nodes in the verified sequence)."""
    accepted, next_token = accept(logits, proposal, params, generator, answer)
    metrics.num_target_forwards += 1
    metrics.num_accepted_tokens += len(accepted)
    if len(proposal):
        per_pos = metrics.num_accepted_tokens_per_pos
        per_pos.extend([0] * (max(proposal.depths) - len(per_pos)))
        for k in range(len(accepted)):
            per_pos[k] += 1
    tokens = [proposal.tokens[node] for node in accepted] + [next_token]
    return tokens, [0] + [node + 1 for node in accepted]


def commit(
    request: Request, new_tokens: list[int], params: SamplingParams, limits: Limits, tokenizer
) -> str:
    """Commit tokens up to EOS / the length cap; set and return the finish reason ('' while
    the request goes on)."""
    request.finish = _extend(request, new_tokens, params, limits.eos_ids, tokenizer)
    request.finish = request.finish or out_of_room(request, params, limits)
    return request.finish


def _extend(request: Request, new_tokens, params, eos: frozenset[int], tokenizer) -> str:
    for token in new_tokens:
        request.generated.append(token)
        request.context.append(token)
        if token in eos:
            return "eos"
        if len(request.generated) >= params.max_new_tokens:
            return "length"
    if params.stop_strings and tokenizer is not None:
        tail = tokenizer.decode(request.generated[-(len(new_tokens) + 16) :])
        if any(stop in tail for stop in params.stop_strings):
            return "stop_string"
    return ""


def output(request: Request, params: SamplingParams, tokenizer) -> GenerationOutput:
    """The request's tokens, text (cut after a stop string) and metrics."""
    request.metrics.num_generated_tokens = len(request.generated)
    text = tokenizer.decode(request.generated) if tokenizer is not None else ""
    if request.finish == "stop_string":
        cut = min(
            (text.find(s) + len(s) for s in params.stop_strings if s in text), default=len(text)
        )
        text = text[:cut]
    return GenerationOutput(request.generated, text, request.metrics, request.finish)
