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
top-k candidates (`PositionTree`, as Medusa's heads do; position_tree.py): at T = 0 ranked,
at T > 0 i.i.d. draws from each slot's q, recursive rejection over siblings keeping the output
distributed as the target's.

The context entries live in buffers indexed by position (`ContextEntries`), growing with the
context or preallocated for a static `cache`'s `max_length` positions: one code path. Eagerly
the block forward reads the filled positions; on a static cache on CUDA it reads every buffer
under a mask of the filled ones, captured once as a CUDA graph and replayed every round.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...architectures.dflash import DflashDrafter, load_dflash
from ...architectures.target import TargetAdapter
from ..cache_settings import GROWING, CacheSettings
from ..drafter_request import DrafterRequest, LoadedDrafter
from ..errors import GenerationError
from ..graphs import CapturedCall, use_cuda_graphs
from ..proposer import Proposer, ProposerError
from ..sampling import SamplingParams
from ..transfer import to_device
from ..tree import Proposal
from .position_tree import PositionTree, TreeDraw, resolve_position_tree


class ContextEntries:
    """Each drafter layer's context keys and values in buffers indexed by position: growing
    with the context (`GROW` positions at a time), or preallocated for a static `cache`'s
    `max_length` positions. Eagerly the block forward reads the filled positions only; with
    CUDA graphs (a static cache on CUDA) it reads every buffer under a mask of the filled ones,
    captured once and replayed every round."""

    GROW = 256

    def __init__(self, drafter: DflashDrafter, cache: CacheSettings) -> None:
        self.drafter = drafter
        weight = drafter.fc.weight
        self.device = weight.device
        self.growable = not cache.static
        self.use_graphs = cache.static and use_cuda_graphs(self.device, cache.cuda_graphs)
        self.buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._reserve(self.GROW if self.growable else cache.max_length)
        self._offsets = torch.arange(drafter.block_size, device=self.device)
        self._call: CapturedCall | None = None
        self.reset()

    def reset(self) -> None:
        self.length = 0

    @property
    def size(self) -> int:
        return self.buffers[0][0].shape[2]

    def nbytes(self) -> int:
        return sum(2 * k.numel() * k.element_size() for k, _ in self.buffers)

    def _reserve(self, size: int) -> None:
        """Buffers of `size` positions, keeping the filled ones."""
        fields, weight = self.drafter.fields, self.drafter.fc.weight
        shape = (1, fields["num_key_value_heads"], size, fields["head_dim"])
        buffers = [(weight.new_zeros(shape), weight.new_zeros(shape)) for _ in self.drafter.layers]
        for (keys, values), (old_keys, old_values) in zip(buffers, self.buffers, strict=False):
            keys[:, :, : self.length] = old_keys[:, :, : self.length]
            values[:, :, : self.length] = old_values[:, :, : self.length]
        self.buffers = buffers
        self._slots = torch.arange(size, device=self.device)

    def append(self, entries: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        end = self.length + entries[0][0].shape[2]
        if end > self.size and not self.growable:
            raise GenerationError(
                f"the static cache holds {self.size} positions; this request needs "
                f"more (raise the cache length)"
            )
        if end > self.size:
            self._reserve(-(-end // self.GROW) * self.GROW)
        for (keys, values), (k, v) in zip(self.buffers, entries, strict=True):
            keys[:, :, self.length : end] = k
            values[:, :, self.length : end] = v
        self.length = end

    def block_logits(self, anchor: torch.Tensor, start: int) -> torch.Tensor:
        """Logits [block_size - 1, V] of the drafted slots of the block at `start`."""
        if not self.use_graphs:
            filled = [(k[:, :, : self.length], v[:, :, : self.length]) for k, v in self.buffers]
            return self._logits(anchor.view(1), (start + self._offsets)[None], filled, None)
        if self._call is None:
            self._call = self._build()
        self._call.inputs["anchor"].copy_(anchor.view(1))
        self._call.inputs["start"].fill_(start)
        return self._call.replay()[0]

    def _logits(self, anchor, positions, entries, mask) -> torch.Tensor:
        drafter = self.drafter
        hidden = drafter.run_block(drafter.block_inputs(anchor), positions, entries, mask)
        return drafter.logits(hidden[0, 1:]).float()

    def _build(self) -> CapturedCall:
        """The block forward over every buffer under a mask of the filled positions (the
        anchor's position = the entries held), captured as a CUDA graph."""
        inputs = {
            "anchor": torch.zeros(1, dtype=torch.long, device=self.device),
            "start": torch.zeros((), dtype=torch.long, device=self.device),
        }
        size = self.drafter.block_size

        def run() -> tuple:
            filled = self._slots < inputs["start"]
            mask = torch.cat([filled, filled.new_ones(size)]).expand(size, -1)[None, None]
            positions = (inputs["start"] + self._offsets)[None]
            return (self._logits(inputs["anchor"], positions, self.buffers, mask),)

        return CapturedCall(inputs, run).capture(self.device)


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
        self.entries = ContextEntries(drafter, cache)
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
