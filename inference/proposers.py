"""Proposers: where draft tokens come from. Each returns a `Proposal` (chain or tree)."""

from __future__ import annotations

import logging
from typing import Protocol

import torch

from ..architectures.errors import DraftzooError
from .cache_settings import GROWING, CacheSettings
from .growing_forward import GrowingForward
from .sampling import SamplingParams, is_distribution, probabilities, sample
from .static_forward import StaticForward
from .transfer import to_device
from .tree import Proposal

logger = logging.getLogger(__name__)


class ProposerError(DraftzooError, ValueError):
    """A proposer that cannot serve this target."""


class Proposer(Protocol):
    """Anything that drafts tokens after `context` (all committed tokens, prompt included).

    These are every call the generate loops make. A class that subclasses `Proposer` inherits
    the defaults below (reads no target states, keeps no cache) and only writes `propose`.
    """

    #: HF hidden-state indices of the target the proposer reads; empty: none
    target_layers: tuple[int, ...] = ()

    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Proposal:
        """A chain or tree of at most `max_tokens` draft tokens on one path."""
        ...

    def reset(self) -> None:
        """Forget the previous request (called before each one)."""

    def observe(self, states: torch.Tensor) -> None:
        """Target states [n, k*h] (the `target_layers`, concatenated) of the next n committed
        positions; called only when `target_layers` is not empty."""

    def cache_nbytes(self) -> int:
        """Bytes of the proposer's own cache, for the memory figures."""
        return 0

    def finish(self, token_ids: list[int]) -> None:
        """The request is done: its every token, prompt and output (proposers that learn
        across requests keep what they need)."""


def vocabularies_match(draft_tokenizer, target_tokenizer) -> bool:
    """Same token -> id map, special tokens included."""
    return draft_tokenizer.get_vocab() == target_tokenizer.get_vocab()


class DraftModelProposer(Proposer):
    """A small causal LM sharing the target's tokenizer drafts a chain autoregressively.

    Its KV cache follows the context: before drafting it is rolled back to the longest prefix
    it shares with the committed tokens, so rejected drafts are dropped and only new tokens are
    fed. The cache is the one-row case of batched decoding: growing (`GrowingForward`), or with
    a static `cache` preallocated (`StaticForward`: CUDA graphs on CUDA). Greedy drafting keeps
    its tokens on the device: the verification reads them with the target's answer, the
    round's one host read.
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        target_tokenizer=None,
        cache: CacheSettings = GROWING,
    ) -> None:
        both = tokenizer is not None and target_tokenizer is not None
        if both and not vocabularies_match(tokenizer, target_tokenizer):
            raise ProposerError(
                f"the draft model's vocabulary ({len(tokenizer)} tokens) differs from the "
                f"target's ({len(target_tokenizer)} tokens); a draft LM must share the "
                "target's tokenizer"
            )
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.forward: GrowingForward | StaticForward = (
            StaticForward(model, cache.max_length, 1, cache.cuda_graphs)
            if cache.static
            else GrowingForward(model)
        )
        #: widths fed with every position's logits (graphed widths of a static cache)
        self._all_logits_width = self.forward.max_graph_width if cache.static else 1
        self.reset()

    def reset(self) -> None:
        """Forget the cached context (a new request)."""
        self.forward.reset(1)
        self.cached_ids: list[int] = []
        self._drafted: Proposal | None = None  # fed drafts not yet in `cached_ids`

    def cache_nbytes(self) -> int:
        """Bytes held by the draft model's KV cache."""
        return self.forward.nbytes()

    def _shared_prefix(self, context: list[int]) -> int:
        shared = 0
        limit = min(len(self.cached_ids), len(context) - 1)
        while shared < limit and self.cached_ids[shared] == context[shared]:
            shared += 1
        return shared

    def _feed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Feed [1, n] tokens into the cache; the last position's logits."""
        width = token_ids.shape[1]  # wider than the graphs: the last logits only (prefill)
        all_logits = width <= self._all_logits_width
        logits = self.forward.forward(token_ids, None, None, all_logits=all_logits)[0, -1]
        self.forward.commit([list(range(width))])
        return logits

    def _sync(self, context: list[int]) -> torch.Tensor:
        """Roll the cache back to the shared prefix; return the logits after `context`."""
        if self._drafted is not None:  # the last chain's fed drafts, read by its verification
            self.cached_ids.extend(self._drafted.tokens[:-1])
            self._drafted = None
        shared = self._shared_prefix(context)
        self.forward.rollback([shared])
        self.cached_ids = list(context)
        return self._feed(to_device([context[shared:]], self.device))

    @torch.no_grad()
    def propose(self, context, max_tokens, params, generator) -> Proposal:
        if max_tokens <= 0:
            return Proposal.chain([])
        logits = self._sync(context)
        if params.greedy:
            return self._greedy_on_device(logits, max_tokens)
        tokens: list[int] = []
        draft_probs = []
        for step in range(max_tokens):
            q = probabilities(logits, params)
            if not is_distribution(q):  # broken weights: no drafts this round
                self._warn_broken()
                break
            tokens.append(sample(q, generator))
            draft_probs.append(q)
            if step + 1 == max_tokens:
                break
            logits = self._feed(torch.tensor([[tokens[-1]]], device=self.device))
            self.cached_ids.append(tokens[-1])
        return Proposal.chain(tokens, torch.stack(draft_probs) if draft_probs else None)

    def _warn_broken(self) -> None:
        if not getattr(self, "_warned", False):
            logger.warning(
                "the draft model's probabilities are not a distribution (NaN or Inf in its "
                "weights?); it drafts nothing in such rounds, and the output stays the target's"
            )
            self._warned = True

    def _greedy_on_device(self, logits: torch.Tensor, max_tokens: int) -> Proposal:
        """Greedy chain whose tokens stay on the device (the verification reads them)."""
        drafted = [logits.argmax(-1)]
        for _ in range(max_tokens - 1):
            drafted.append(self._feed(drafted[-1].view(1, 1)).argmax(-1))
        self._drafted = Proposal.chain(torch.stack(drafted))
        return self._drafted
