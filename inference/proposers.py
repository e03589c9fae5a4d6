"""Proposers: where draft tokens come from. Each returns a `Proposal` (chain or tree)."""

from __future__ import annotations

from typing import Protocol

import torch

from .kv_cache import cache_kwargs, cache_nbytes, crop
from .sampling import SamplingParams, probabilities, sample
from .tree import Proposal


class ProposerError(ValueError):
    """A proposer that cannot serve this target."""


class Proposer(Protocol):
    """Anything that drafts tokens after `context` (all committed tokens, prompt included)."""

    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Proposal: ...


class PromptLookupProposer:
    """n-gram lookup in the context (no model): copy what followed the last match.

    Tries the longest suffix n-gram first (max_ngram down to min_ngram) and takes the most
    recent earlier occurrence, as transformers' `prompt_lookup_num_tokens` and vLLM's ngram
    proposer do.
    """

    def __init__(self, min_ngram: int = 1, max_ngram: int = 3) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram

    def propose(self, context, max_tokens, params, generator) -> Proposal:
        length = len(context)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            suffix = context[length - n :]
            for start in range(length - n - 1, -1, -1):
                if context[start : start + n] == suffix:
                    follow = context[start + n : start + n + max_tokens]
                    if follow:
                        return Proposal.chain(follow)
        return Proposal.chain([])


def vocabularies_match(draft_tokenizer, target_tokenizer) -> bool:
    """Same token -> id map, special tokens included."""
    return draft_tokenizer.get_vocab() == target_tokenizer.get_vocab()


class DraftModelProposer:
    """A small causal LM sharing the target's tokenizer drafts a chain autoregressively.

    Its KV cache follows the context: before drafting it is cropped to the longest prefix it
    shares with the committed tokens, so rejected drafts are rolled back and only new tokens
    are fed.
    """

    def __init__(self, model, tokenizer=None, target_tokenizer=None) -> None:
        both = tokenizer is not None and target_tokenizer is not None
        if both and not vocabularies_match(tokenizer, target_tokenizer):
            raise ProposerError(
                f"the draft model's vocabulary ({len(tokenizer)} tokens) differs from the "
                f"target's ({len(target_tokenizer)} tokens); a draft LM must share the "
                "target's tokenizer"
            )
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.cache = None
        self.cached_ids: list[int] = []

    def reset(self) -> None:
        """Forget the cached context (a new request)."""
        self.cache, self.cached_ids = None, []

    def cache_nbytes(self) -> int:
        """Bytes held by the draft model's KV cache."""
        return cache_nbytes(self.cache)

    def _sync(self, context: list[int]) -> torch.Tensor:
        """Roll the cache back to the shared prefix; return the logits after `context`."""
        from transformers import DynamicCache

        shared = 0
        limit = min(len(self.cached_ids), len(context) - 1)
        while shared < limit and self.cached_ids[shared] == context[shared]:
            shared += 1
        if self.cache is None:
            self.cache = DynamicCache()
        crop(self.cache, shared)
        new = torch.tensor([context[shared:]], device=self.device)
        out = self.model(input_ids=new, **cache_kwargs(self.model, self.cache, True))
        self.cached_ids = list(context)
        return out.logits[0, -1]

    @torch.no_grad()
    def propose(self, context, max_tokens, params, generator) -> Proposal:
        if max_tokens <= 0:
            return Proposal.chain([])
        logits = self._sync(context)
        tokens: list[int] = []
        draft_probs = []
        for step in range(max_tokens):
            q = probabilities(logits, params)
            token = int(q.argmax()) if params.greedy else sample(q, generator)
            tokens.append(token)
            draft_probs.append(q)
            if step + 1 == max_tokens:
                break
            token_ids = torch.tensor([[token]], device=self.device)
            out = self.model(input_ids=token_ids, **cache_kwargs(self.model, self.cache))
            self.cached_ids.append(token)
            logits = out.logits[0, -1]
        return Proposal.chain(tokens, None if params.greedy else torch.stack(draft_probs))
