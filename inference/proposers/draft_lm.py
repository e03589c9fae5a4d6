"""The draft-LM family's runtime: a small causal LM on the target's tokenizer drafts chains
(`DraftModelProposer`), through the rows of its head its draft vocabulary keeps where it
ships one."""

from __future__ import annotations

import logging

import torch

from ...architectures.draft_lm import install_draft_vocab
from ...architectures.drafter_files import DrafterFiles, opened
from ...architectures.drafter_io import DRAFT_VOCAB_FILE, DrafterError
from ...architectures.safe_load import load_tokenizer
from ...architectures.target import TargetAdapter
from ..cache_settings import GROWING, CacheSettings
from ..drafter_request import DrafterRequest, LoadedDrafter
from ..growing_forward import GrowingForward
from ..proposer import Proposer, ProposerError
from ..sampling import is_distribution, probabilities, sample
from ..static_forward import StaticForward
from ..transfer import to_device
from ..tree import Proposal

logger = logging.getLogger(__name__)


def load_runtime(folder, record: dict, target, tokenizer, request: DrafterRequest):
    """A draft LM sharing the target's tokenizer, loaded for `target` (the draft-LM family's
    `runtime`; chains only), built from the files the front door read."""
    files = opened(folder, request.files)
    files.check_target(TargetAdapter(target, tokenizer).fingerprint())
    if not vocabularies_match(load_tokenizer(folder), tokenizer):
        raise ProposerError(f"drafter {folder} does not share the target's tokenizer")
    draft = causal_lm(files, target.dtype).to(next(target.parameters()).device).eval()
    if files.record.get("draft_vocab_file") is not None:
        install_draft_vocab(draft, files.data(DRAFT_VOCAB_FILE), f"{folder}/{DRAFT_VOCAB_FILE}")

    def make() -> Proposer:
        return DraftModelProposer(draft, None, None, request.cache)

    return LoadedDrafter(draft, make)


def causal_lm(files: DrafterFiles, dtype):
    """The transformers causal LM whose config and weights `files` hold (its own classes only:
    a config naming code of its own is refused by transformers without trust_remote_code)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = files.json()
    model_type = fields.pop("model_type", None)
    if not isinstance(model_type, str):
        raise DrafterError(f"{files.folder}/config.json names no transformers model_type")
    config = AutoConfig.for_model(model_type, **fields)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    loaded = model.load_state_dict(files.weights(), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [key for key in loaded.missing_keys if key not in tied]
    if missing or loaded.unexpected_keys:
        raise DrafterError(
            f"{files.folder}: weights do not match its config (missing {missing[:4]}, "
            f"unexpected {loaded.unexpected_keys[:4]})"
        )
    model.tie_weights()
    return model


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
