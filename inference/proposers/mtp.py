"""The MTP proposer: D sequential modules draft a chain from the target's final state.

Module k at position p reads h^k_p (k = 0: the target's state, handed over by the generate
loop after every verification as for EAGLE; k > 0: what module k - 1 hands over at p, its
post-norm output or, with the `residual` hand-over, its block's output before post_norm —
`MtpDrafter.module` returns it and `logits` reads it either way) and token x_{p+k+1}, so its
entries are real once x_{p+k+1} is committed. Each round, with c committed tokens:

1. catch up: every module k feeds its new real entries (p < c - 1 - k) into its layer of the
   drafter's cache; they stay, and their outputs are module k + 1's inputs;
2. module 0's output at c - 2 drafts d_1; module k (1 <= k < D) then feeds its entries at
   p = c - 1 - k .. c - 2, whose tokens are committed ones or the drafts d_1..d_k and whose
   inputs are module k - 1's real or just-drafted outputs, and its output at c - 2 drafts
   d_{k+1} — exactly the pattern it was trained on;
3. past D tokens the last module is reused on what it hands over, one position further each
   step (with one module, as vLLM and SGLang do when more tokens are asked);
4. what was drafted is never read again: module k's entries live at their positions' slots
   (`mtp_slots.py`), so rolling back is only its count of real entries.

Greedy drafts are each module's argmax; at T > 0 each draft is sampled from its q (Gumbel-max),
which is returned for lossless acceptance. The drafts stay on the device: the verification reads
them with the target's answer.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...architectures.mtp import MtpDrafter, load_mtp
from ...architectures.target import TargetAdapter
from ..cache_settings import GROWING, CacheSettings
from ..drafter_request import DrafterRequest, LoadedDrafter
from ..proposer import Proposer
from ..sampling import SamplingParams, gumbel_argmax, probabilities
from ..transfer import to_device
from ..tree import Proposal
from .mtp_slots import ModuleSlots


class MtpProposer(Proposer):
    """Drafts chains with an `MtpDrafter` (trees are not offered: one path per module).

    The modules' caches are slot buffers (`mtp_slots.py`): growing with the context, or with a
    static `cache` preallocated for its `max_length` positions and replayed as CUDA graphs on
    CUDA."""

    def __init__(
        self,
        drafter: MtpDrafter,
        cache: CacheSettings = GROWING,
    ) -> None:
        self.drafter = drafter.eval()
        self.slots = ModuleSlots(drafter, cache)
        self.target_layers = drafter.layers_read
        weight = drafter.layers[0].eh_proj.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.reset()

    @classmethod
    def from_pretrained(cls, path: str | Path, target, tokenizer=None) -> MtpProposer:
        """Load an MTP drafter folder for `target` (a transformers causal LM), checked."""
        adapter = TargetAdapter(target, tokenizer)
        return cls(load_mtp(Path(path), adapter, dtype=target.dtype))

    def reset(self) -> None:
        """Forget the request: no real entry (the slots written stay, never read again)."""
        depth = self.drafter.depth
        self.fed = [0] * depth  # real entries in module k's cache
        #: module k's inputs at real positions: the target's states (k = 0) or module k-1's
        #: real outputs
        self.inputs: list[torch.Tensor] = [
            torch.empty(0, self.drafter.fields["hidden_size"], device=self.device, dtype=self.dtype)
            for _ in range(depth)
        ]
        self.last: torch.Tensor | None = None  # module 0's output at the last real position

    def cache_nbytes(self) -> int:
        """Bytes held by the modules' KV cache."""
        return self.slots.nbytes()

    def observe(self, states: torch.Tensor) -> None:
        """Target states [n, h] of the next n committed positions."""
        if len(states):
            self.inputs[0] = torch.cat([self.inputs[0], states.to(self.device, self.dtype)])

    # -- feeding ---------------------------------------------------------------------------
    def _feed(self, k: int, previous: torch.Tensor, ids: torch.Tensor, first: int) -> torch.Tensor:
        """Module k over positions first.. (tokens `ids` [n] on the device) after its cached
        entries, each seeing the cache and the new entries up to itself; outputs [n, h]."""
        return self.slots.forward(k, ids, previous, first)

    def _catch_up(self, context: list[int]) -> bool:
        """Feed every module's new real entries; False when no state exists yet."""
        c = len(context)
        if len(self.inputs[0]) != c - 1:
            if c == 1 and not len(self.inputs[0]):
                return False
            raise RuntimeError(
                f"target states cover {len(self.inputs[0])} positions, the context has {c} "
                "tokens; every committed position but the last needs its state"
            )
        for k in range(self.drafter.depth):
            start, end = self.fed[k], min(len(self.inputs[k]), c - 1 - k)
            if end <= start:
                continue
            ids = to_device(context[start + k + 1 : end + k + 1], self.device)
            out = self._feed(k, self.inputs[k][start:end], ids, start)
            self.fed[k] = end
            if k + 1 < self.drafter.depth:
                self.inputs[k + 1] = torch.cat([self.inputs[k + 1], out])
            if k == 0:
                self.last = out[-1]
        return self.last is not None

    # -- drafting --------------------------------------------------------------------------
    @torch.no_grad()
    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Proposal:
        if not self._catch_up(context) or max_tokens <= 0:
            return Proposal.chain([])
        return self._chain(context, max_tokens, params, generator)

    def _chain(self, context, max_tokens, params, generator) -> Proposal:
        """The drafts stay on the device (each [1]); the verification reads them."""
        c, depth = len(context), self.drafter.depth
        drafts: list[torch.Tensor] = []
        qs: list[torch.Tensor] = []

        def draw(hidden: torch.Tensor, k: int) -> None:
            logits = self.drafter.logits(hidden, k).float()
            if params.greedy:
                drafts.append(logits.argmax(-1, keepdim=True))
            else:
                q = probabilities(logits, params)
                drafts.append(gumbel_argmax(q, generator).view(1))
                qs.append(q)

        draw(self.last, 0)
        # module k-1's outputs at the positions it drafted at: none for module 0
        spec = self.last.new_empty(0, self.last.shape[-1])
        hidden = self.last
        for k in range(1, min(depth, max_tokens)):
            start = self.fed[k]
            previous = torch.cat([self.inputs[k][start:], spec])
            # tokens start + k + 1 .. c + k - 1: committed ones, then the k drafts so far
            committed = to_device(context[start + k + 1 : c], self.device)
            ids = torch.cat([committed, *drafts[:k]])
            spec = self._feed(k, previous, ids, start)
            hidden = spec[-1]
            draw(hidden, k)
        # past the modules: the last one again, on its own output, one position further
        last_module, position = min(depth, max_tokens) - 1, c - 1
        while len(drafts) < max_tokens:
            out = self._feed(last_module, hidden[None], drafts[-1], position)
            hidden, position = out[-1], position + 1
            draw(hidden, last_module)
        if params.greedy:
            return Proposal.chain(torch.cat(drafts))
        return Proposal.chain(torch.cat(drafts), torch.stack(qs))


def load_runtime(folder: Path, record: dict, target, tokenizer, request: DrafterRequest):
    """MTP modules loaded for `target` (the family's `runtime`; chains only)."""
    adapter = TargetAdapter(target, tokenizer)
    drafter = load_mtp(Path(folder), adapter, target.dtype, record, files=request.files)

    def make() -> Proposer:
        return MtpProposer(drafter, request.cache)

    return LoadedDrafter(drafter, make)
