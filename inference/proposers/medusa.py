"""Medusa proposers: chains and static trees from K heads on the target's last state.

The generate loops hand the proposer the target's final post-norm state of every committed
position (`observe`); the last one is the state whose own next token is the root (the last
committed token). Head k read at that state predicts the token k places after the root, so one
call of the heads drafts a whole chain: no drafter cache, nothing to roll back.

Chain: each head's argmax (T = 0), or a token sampled from each head's own distribution q_k
(T > 0, by Gumbel-max on the device; q returned for lossless acceptance). Chains and greedy
trees stay on the device until the verification reads them with the target's answer.
Tree (`MedusaTree`, Medusa's `medusa_choices`): a path (i_1, ..., i_d) is the node under the
node of the path without its last index whose token is, at T = 0, head d's i_d-th most likely
token; at T > 0, the i_d-th of `top_k` tokens drawn i.i.d. from head d's q_d (as EAGLE's
sampled trees draw children), with q_d returned. A head's distribution does not depend on the
node above, so every node's children are i.i.d. draws from the q they are verified against,
and recursive rejection over siblings keeps the output distributed as the target's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...architectures.families import family_spec
from ...architectures.lora_adapter import adapter_dir, merge_adapter
from ...architectures.medusa import MedusaHeads, load_medusa
from ...architectures.target import TargetAdapter
from ..cache_settings import GROWING, CacheSettings
from ..drafter_request import DrafterRequest, LoadedDrafter
from ..graphs import CapturedCall, use_cuda_graphs
from ..proposer import Proposer, ProposerError
from ..sampling import SamplingParams
from ..tree import Proposal
from .position_tree import PositionTree, TreeDraw, resolve_position_tree

#: Medusa's static tree is the shared per-position tree (inference/proposers/position_tree.py)
MedusaTree = PositionTree


def resolve_medusa_tree(
    tree: PositionTree | None, num_heads: int, calibrated: PositionTree | None = None
) -> PositionTree:
    """The Medusa tree to draft (`resolve_position_tree` for `num_heads` heads)."""
    return resolve_position_tree(tree, num_heads, calibrated)


def calibrated_tree(record: dict) -> MedusaTree | None:
    """The tree a Medusa drafter's training chose from held-out accuracies, if it did."""
    settings = record.get("training", {}).get("calibrated_tree")
    if not settings:
        return None
    return MedusaTree(tuple(tuple(path) for path in settings["choices"]))


class MedusaProposer(Proposer):
    """Drafts with Medusa heads; a chain, or a static tree when `tree` is given.

    A static `cache`: the heads' round (heads, ranking or Gumbel-max draws, the tree's gather)
    replays as a CUDA graph on CUDA, one per depth and sampling setting; the heads keep no
    cache, so nothing else changes."""

    def __init__(
        self,
        heads: MedusaHeads,
        target_layer: int,
        tree: MedusaTree | None = None,
        cache: CacheSettings = GROWING,
    ) -> None:
        if tree is not None and tree.depth > heads.num_heads:
            raise ProposerError(
                f"the Medusa tree is {tree.depth} deep but the drafter has {heads.num_heads} "
                "heads; each depth needs its own head"
            )
        self.heads = heads.eval()
        self.tree = tree
        self.target_layers = (target_layer,)
        self.device = heads.lm_heads[0].weight.device
        self.use_graphs = cache.static and use_cuda_graphs(self.device, cache.cuda_graphs)
        self._graphs: dict[tuple, CapturedCall] = {}
        self.draw = TreeDraw(tree, self.device)
        self.reset()

    @classmethod
    def from_pretrained(
        cls, path: str | Path, target, tokenizer=None, tree: MedusaTree | None = None
    ) -> MedusaProposer:
        """Load heads for `target` (a transformers causal LM), checked against it."""
        adapter = TargetAdapter(target, tokenizer)
        heads = load_medusa(Path(path), adapter, dtype=target.dtype)
        return cls(heads, adapter.num_layers, tree)

    def reset(self) -> None:
        """Forget the request."""
        self.last: torch.Tensor | None = None  # [h]: the state before the root
        self.seen = 0  # committed positions whose state was observed

    def observe(self, states: torch.Tensor) -> None:
        """Target final states [n, h] of the next n committed positions."""
        if len(states):
            self.last = states[-1]
            self.seen += len(states)

    @torch.no_grad()
    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Proposal:
        if max_tokens <= 0 or self.last is None:
            return Proposal.chain([])
        if self.seen != len(context) - 1:
            raise RuntimeError(
                f"target states cover {self.seen} positions, the context has {len(context)} "
                "tokens; every committed position but the last needs its state"
            )
        limit = self.tree.depth if self.tree is not None else self.heads.num_heads
        depth = min(max_tokens, limit)
        # T > 0: `width` i.i.d. draws from each head's q
        uniforms = self.draw.uniforms(depth, self.heads.vocab_size, params, generator)
        last = self.last.to(self.device)
        if not self.use_graphs:
            tokens, draft_probs = self._draft(last, depth, params, uniforms)
        else:
            tokens, draft_probs = self._replay(last, depth, params, uniforms)
        return self.draw.proposal(tokens, draft_probs, depth)

    def _draft(self, last, depth, params, uniforms):
        """The heads' tokens [nodes] and, at T > 0, each node's head's q [nodes, V]."""
        return self.draw.draft(self.heads(last, heads=depth), params, uniforms)

    def _replay(self, last, depth, params, uniforms):
        key = (depth, params.temperature, params.top_k, params.top_p)
        entry = self._graphs.get(key)
        if entry is None:
            if self.tree is not None:
                self.draw.layout(depth)  # its tensors exist before the capture
            inputs = {"last": torch.zeros_like(last)}
            if uniforms is not None:
                inputs["uniforms"] = torch.rand_like(uniforms)
            entry = CapturedCall(
                inputs,
                lambda: self._draft(inputs["last"], depth, params, inputs.get("uniforms")),
            )
            self._graphs[key] = entry.capture(self.device)
        entry.inputs["last"].copy_(last)
        if uniforms is not None:
            entry.inputs["uniforms"].copy_(uniforms)
        return entry.replay()


def load_runtime(folder: Path, record: dict, target, tokenizer, request: DrafterRequest):
    """Medusa heads loaded for `target` (the family's `runtime`): chains of at most one token
    per head, or a static `MedusaTree` (the drafter's calibrated one unless another is named).
    A Medusa-2 drafter's adapter is merged into `target` in place, after every check: its
    heads are verified by the adapted target."""
    adapter = TargetAdapter(target, tokenizer)
    heads = load_medusa(Path(folder), adapter, target.dtype, record, request.files)
    length = request.num_speculative_tokens
    tree = None
    if not request.drafts_tree and length is not None and length > heads.num_heads:
        raise ProposerError(
            f"drafter {folder} has {heads.num_heads} Medusa heads, so its chains are at most "
            f"{heads.num_heads} tokens long; asked for {length}"
        )
    if request.drafts_tree:
        tree = resolve_medusa_tree(request.tree_or(None), heads.num_heads, calibrated_tree(record))

    # built now, so a tree the heads cannot draft is refused before the target is touched;
    # the first request gets it
    built = [MedusaProposer(heads, adapter.num_layers, tree, request.cache)]

    def make() -> Proposer:
        return (
            built.pop() if built else MedusaProposer(heads, adapter.num_layers, tree, request.cache)
        )

    if family_spec(record["family"]).adapts_target:
        merge_adapter(target, adapter_dir(folder), request.files)
    return LoadedDrafter(heads, make, tree)
