"""The DFlash proposer: one drafter forward per round drafts a whole chain.

The generate loops hand the proposer the target's states at the drafter's taps for every
committed position but the last (`observe`). Each round first turns the new states into context
entries (each layer's keys and values of `hidden_norm(fc(states))`); they are real and stay,
and nothing else is ever cached, so there is nothing to roll back. The block is then the last
committed token (the anchor, at position c - 1) followed by mask tokens; one forward over it,
seeing every context entry and the whole block, gives the draft of position c - 1 + i at slot
i. The chain is the first min(asked, block_size - 1) slots.

Greedy drafts are each slot's argmax. At T > 0 each slot's draft is sampled from that slot's
own q (which does not depend on the earlier drafts, so every draft is distributed as the q
returned with it) and accepted by the usual rejection test: lossless. Since no slot's q depends
on the tokens drafted before it, the same forward also drafts a static tree over the slots'
top-k candidates (`PositionTree`, as Medusa's heads do; inference/position_tree.py): at T = 0
ranked, at T > 0 i.i.d. draws from each slot's q, recursive rejection over siblings keeping the
output distributed as the target's.

A static `cache`: the context entries live in buffers preallocated for `max_length` positions;
the block forward reads all of them under a mask of the filled ones, so it is captured once as
a CUDA graph on CUDA and replayed every round (off CUDA it runs eagerly on the same buffers).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..architectures.dflash import DflashDrafter, load_dflash
from ..architectures.eagle import DraftCache
from ..architectures.target import TargetAdapter
from .cache_settings import GROWING, CacheSettings
from .drafter_request import DrafterRequest, LoadedDrafter
from .errors import GenerationError
from .graphs import CapturedCall, use_cuda_graphs
from .position_tree import PositionTree, TreeDraw, resolve_position_tree
from .proposers import Proposer, ProposerError
from .sampling import SamplingParams
from .transfer import to_device
from .tree import Proposal


class GrowingEntries:
    """Context entries in per-layer caches that grow with the context."""

    def __init__(self, drafter: DflashDrafter) -> None:
        self.drafter = drafter
        self.reset()

    def reset(self) -> None:
        self.caches = [DraftCache() for _ in self.drafter.layers]

    @property
    def length(self) -> int:
        return len(self.caches[0])

    def nbytes(self) -> int:
        return sum(cache.nbytes() for cache in self.caches)

    def append(self, entries: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for cache, (keys, values) in zip(self.caches, entries, strict=True):
            cache.append(keys, values)

    def block_logits(self, anchor: torch.Tensor, start: int) -> torch.Tensor:
        """Logits [block_size - 1, V] of the drafted slots of the block at `start`."""
        drafter = self.drafter
        ids = drafter.block_inputs(anchor.view(1))
        positions = torch.arange(start, start + drafter.block_size, device=ids.device)[None]
        entries = [(cache.keys, cache.values) for cache in self.caches]
        hidden = drafter.run_block(ids, positions, entries, None)
        return drafter.logits(hidden[0, 1:]).float()


class StaticEntries:
    """Context entries in buffers preallocated for `max_length` positions; the block forward
    reads them all under a mask of the filled ones (a CUDA graph on CUDA)."""

    def __init__(
        self, drafter: DflashDrafter, max_length: int, cuda_graphs: bool | None = None
    ) -> None:
        self.drafter, self.max_length = drafter, max_length
        weight = drafter.fc.weight
        self.device = weight.device
        self.use_graphs = use_cuda_graphs(self.device, cuda_graphs)
        fields = drafter.fields
        shape = (1, fields["num_key_value_heads"], max_length, fields["head_dim"])
        self.buffers = [(weight.new_zeros(shape), weight.new_zeros(shape)) for _ in drafter.layers]
        self._slots = torch.arange(max_length, device=self.device)
        self._offsets = torch.arange(drafter.block_size, device=self.device)
        self._call: CapturedCall | None = None
        self.reset()

    def reset(self) -> None:
        self.length = 0

    def nbytes(self) -> int:
        return sum(2 * k.numel() * k.element_size() for k, _ in self.buffers)

    def append(self, entries: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        n = entries[0][0].shape[2]
        end = self.length + n
        if end > self.max_length:
            raise GenerationError(
                f"the static cache holds {self.max_length} positions; this request needs "
                f"more (raise the cache length)"
            )
        for (keys, values), (k, v) in zip(self.buffers, entries, strict=True):
            keys[:, :, self.length : end] = k
            values[:, :, self.length : end] = v
        self.length = end

    def _build(self) -> CapturedCall:
        inputs = {
            "anchor": torch.zeros(1, dtype=torch.long, device=self.device),
            "start": torch.zeros((), dtype=torch.long, device=self.device),
        }
        drafter, size = self.drafter, self.drafter.block_size

        def run() -> tuple:
            ids = drafter.block_inputs(inputs["anchor"])
            positions = (inputs["start"] + self._offsets)[None]
            filled = self._slots < inputs["start"]  # the anchor's position = entries held
            seen = torch.cat([filled, filled.new_ones(size)])
            mask = seen.expand(size, -1)[None, None]
            hidden = drafter.run_block(ids, positions, self.buffers, mask)
            return (drafter.logits(hidden[0, 1:]).float(),)

        call = CapturedCall(inputs, run)
        return call.capture(self.device) if self.use_graphs else call

    def block_logits(self, anchor: torch.Tensor, start: int) -> torch.Tensor:
        """Logits [block_size - 1, V] of the drafted slots of the block at `start`."""
        if self._call is None:
            self._call = self._build()
        self._call.inputs["anchor"].copy_(anchor.view(1))
        self._call.inputs["start"].fill_(start)
        return self._call.replay()[0]


class DflashProposer(Proposer):
    """Drafts chains of up to `block_size - 1` tokens with a `DflashDrafter`, or a static
    `tree` over its slots' candidates."""

    def __init__(
        self,
        drafter: DflashDrafter,
        cache: CacheSettings = GROWING,
        tree: PositionTree | None = None,
    ) -> None:
        if tree is not None and tree.depth > drafter.block_size - 1:
            raise ProposerError(
                f"the tree is {tree.depth} deep but the drafter's blocks draft "
                f"{drafter.block_size - 1} positions"
            )
        self.drafter = drafter.eval()
        self.tree = tree
        self.target_layers = drafter.taps
        self.device, self.dtype = drafter.fc.weight.device, drafter.fc.weight.dtype
        self.entries: GrowingEntries | StaticEntries = (
            StaticEntries(drafter, cache.max_length, cache.cuda_graphs)
            if cache.static
            else GrowingEntries(drafter)
        )
        self.draw = TreeDraw(tree, self.device)
        self.reset()

    @classmethod
    def from_pretrained(cls, path: str | Path, target, tokenizer=None) -> DflashProposer:
        """Load a drafter folder for `target` (a transformers causal LM), checked against it."""
        adapter = TargetAdapter(target, tokenizer)
        return cls(load_dflash(Path(path), adapter, dtype=target.dtype))

    def reset(self) -> None:
        """Forget the request: no context entries, no pending states."""
        self.pending: list[torch.Tensor] = []
        self.entries.reset()

    def cache_nbytes(self) -> int:
        """Bytes held by the context entries."""
        return self.entries.nbytes()

    def observe(self, states: torch.Tensor) -> None:
        """Target states [n, k*h] of the next n committed positions."""
        if len(states):
            self.pending.append(states.to(self.device, self.dtype))

    def _catch_up(self, context: list[int]) -> bool:
        """Turn pending states into context entries; False for a one-token prompt (no state
        to draft from yet)."""
        if self.pending:
            states = torch.cat(self.pending)[None]
            self.pending = []
            fed, n = self.entries.length, states.shape[1]
            positions = torch.arange(fed, fed + n, device=self.device)[None]
            self.entries.append(self.drafter.entries(self.drafter.context(states), positions))
        if self.entries.length != len(context) - 1:
            raise RuntimeError(
                f"target states cover {self.entries.length} positions, the context has "
                f"{len(context)} tokens; every committed position but the last needs its state"
            )
        return self.entries.length > 0

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
        anchor = to_device([context[-1]], self.device)
        logits = self.entries.block_logits(anchor, len(context) - 1)
        limit = self.tree.depth if self.tree is not None else self.drafter.block_size - 1
        depth = min(max_tokens, limit)
        logits = logits[:depth]
        uniforms = self.draw.uniforms(depth, logits.shape[-1], params, generator)
        tokens, q = self.draw.draft(logits, params, uniforms)
        return self.draw.proposal(tokens, q, depth)


def load_runtime(folder: Path, record: dict, target, tokenizer, request: DrafterRequest):
    """A DFlash drafter loaded for `target` (the family's `runtime`): chains of up to
    `block_size - 1` tokens, or a static `PositionTree` over its slots (the default tree cut to
    the block unless one is named)."""
    adapter = TargetAdapter(target, tokenizer)
    drafter = load_dflash(Path(folder), adapter, target.dtype, record, request.files)
    longest = drafter.block_size - 1
    asked = request.num_speculative_tokens
    tree = None
    if request.drafts_tree:
        tree = resolve_position_tree(request.tree_or(None), longest)
    elif asked is not None and asked > longest:
        raise ProposerError(
            f"drafter {folder} drafts blocks of {drafter.block_size} (the anchor and "
            f"{longest} tokens), so its chains are at most {longest} tokens long; asked for "
            f"{asked}"
        )
    # built now, so a tree deeper than the block is refused before anything runs
    built = [DflashProposer(drafter, request.cache, tree)]

    def make() -> Proposer:
        return built.pop() if built else DflashProposer(drafter, request.cache, tree)

    return LoadedDrafter(drafter, make, tree)
