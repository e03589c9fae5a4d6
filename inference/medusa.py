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

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..architectures.families import family_spec
from ..architectures.lora_adapter import adapter_dir, merge_adapter
from ..architectures.medusa import MedusaHeads, load_medusa
from ..architectures.medusa_tree import calibrated_choices, estimated_acceptance
from ..architectures.target import TargetAdapter
from .cache_settings import GROWING, CacheSettings
from .drafter_request import DrafterRequest, LoadedDrafter
from .graphs import CapturedCall, use_cuda_graphs
from .proposers import Proposer, ProposerError
from .sampling import SamplingParams, gumbel_pick, probabilities
from .tree import Proposal, TreeSettings

#: a sparse 16-node tree for 4 heads: wide near the root, one path deep
DEFAULT_CHOICES: tuple[tuple[int, ...], ...] = (
    (0,),
    (1,),
    (2,),
    (3,),
    (0, 0),
    (0, 1),
    (0, 2),
    (1, 0),
    (1, 1),
    (2, 0),
    (0, 0, 0),
    (0, 0, 1),
    (0, 1, 0),
    (1, 0, 0),
    (0, 0, 0, 0),
    (0, 0, 0, 1),
)


@dataclass(frozen=True)
class MedusaTree:
    """A static Medusa tree: paths of per-depth top-k indices (`medusa_choices`)."""

    choices: tuple[tuple[int, ...], ...] = DEFAULT_CHOICES

    def __post_init__(self) -> None:
        paths = [tuple(p) for p in self.choices]
        if not paths or any(not p or min(p) < 0 for p in paths):
            raise ValueError("a Medusa tree is a non-empty list of non-empty index paths >= 0")
        if len(set(paths)) != len(paths):
            raise ValueError("a Medusa tree lists a path twice")
        missing = sorted({p[:-1] for p in paths if len(p) > 1} - set(paths))
        if missing:
            raise ValueError(f"a Medusa tree needs every path's parent; missing {missing}")
        object.__setattr__(self, "choices", tuple(sorted(paths, key=lambda p: (len(p), p))))

    @classmethod
    def default(cls, num_heads: int) -> MedusaTree:
        """`DEFAULT_CHOICES` without the paths deeper than `num_heads`."""
        return cls(tuple(p for p in DEFAULT_CHOICES if len(p) <= num_heads))

    @classmethod
    def calibrated(cls, rank_accuracy: Sequence[Sequence[float]], nodes: int) -> MedusaTree:
        """The `nodes` paths with the highest estimated acceptance given each head's measured
        rank accuracies (`architectures.medusa_tree`)."""
        return cls(tuple(calibrated_choices(rank_accuracy, nodes)))

    def estimated_acceptance(self, rank_accuracy: Sequence[Sequence[float]]) -> float:
        """Expected tokens per round under per-head independence."""
        return estimated_acceptance(self.choices, rank_accuracy)

    @property
    def depth(self) -> int:
        """The longest path: the heads it needs."""
        return max(len(p) for p in self.choices)

    @property
    def top_k(self) -> int:
        """Candidates each head must rank."""
        return 1 + max(max(p) for p in self.choices)

    def layout(self, depth: int, width: int) -> tuple[list[int], list[int]]:
        """(where each node's token sits in a flattened [heads, width] table, its parent) for
        the tree's nodes up to `depth`."""
        index: dict[tuple[int, ...], int] = {}
        cells, parents = [], []
        for path in self.choices:
            if len(path) > depth:
                continue
            index[path] = len(cells)
            cells.append((len(path) - 1) * width + path[-1])
            parents.append(index[path[:-1]] if len(path) > 1 else -1)
        return cells, parents


def resolve_medusa_tree(
    tree: MedusaTree | TreeSettings, num_heads: int, calibrated: MedusaTree | None = None
) -> MedusaTree:
    """The Medusa tree to draft: a `MedusaTree` as given; for tree settings left at EAGLE's
    defaults (no Medusa tree named), the drafter's `calibrated` tree, else the default tree cut
    to the heads' depth. EAGLE settings that were changed are refused rather than ignored."""
    if isinstance(tree, MedusaTree):
        return tree
    if tree != TreeSettings():
        raise ProposerError(
            "EAGLE tree settings (top_k, depth, total_tokens, sampled_children) do not apply "
            "to Medusa heads; pass a MedusaTree(choices=...)"
        )
    return calibrated if calibrated is not None else MedusaTree.default(num_heads)


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
        #: per depth: the tree's cells in the [depth, top_k] ranking, parents, node heads
        self._layouts: dict[int, tuple[torch.Tensor, list[int], torch.Tensor]] = {}
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
        width = self.tree.top_k if self.tree is not None else 1
        uniforms = None  # T > 0: `width` i.i.d. draws from each head's q
        if not params.greedy:
            shape = (depth, width, self.heads.vocab_size)
            uniforms = torch.rand(shape, generator=generator, device=self.device)
        last = self.last.to(self.device)
        if not self.use_graphs:
            tokens, draft_probs = self._draft(last, depth, params, uniforms)
        else:
            tokens, draft_probs = self._replay(last, depth, params, uniforms)
        if self.tree is None:
            return Proposal.chain(tokens, draft_probs)  # read with the verification
        return Proposal(tokens, self._layout(depth)[1], draft_probs)

    def _draft(self, last, depth, params, uniforms):
        """The heads' tokens [nodes] and, at T > 0, each node's head's q [nodes, V]."""
        logits = self.heads(last, heads=depth)  # [depth, V]
        width = self.tree.top_k if self.tree is not None else 1
        q = None
        if params.greedy and self.tree is None:
            ranked = logits.argmax(-1, keepdim=True)  # [depth, 1]
        elif params.greedy:
            ranked = logits.topk(width, dim=-1).indices  # [depth, width], best first
        else:
            q = probabilities(logits, params)  # each head's own q
            ranked = gumbel_pick(q[:, None].expand(-1, width, -1), uniforms)
        if self.tree is None:
            return ranked[:, 0], q
        cells, _, node_heads = self._layout(depth)
        tokens = ranked.reshape(-1).index_select(0, cells)
        return tokens, None if q is None else q.index_select(0, node_heads)

    def _layout(self, depth: int) -> tuple[torch.Tensor, list[int], torch.Tensor]:
        if depth not in self._layouts:
            cells, parents = self.tree.layout(depth, self.tree.top_k)
            heads: list[int] = []  # a node's head: its depth - 1
            for parent in parents:
                heads.append(0 if parent < 0 else heads[parent] + 1)
            self._layouts[depth] = (
                torch.tensor(cells, device=self.device),
                parents,
                torch.tensor(heads, device=self.device),
            )
        return self._layouts[depth]

    def _replay(self, last, depth, params, uniforms):
        key = (depth, params.temperature, params.top_k, params.top_p)
        entry = self._graphs.get(key)
        if entry is None:
            if self.tree is not None:
                self._layout(depth)  # its tensors exist before the capture
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
    heads = load_medusa(Path(folder), adapter, dtype=target.dtype, record=record)
    length = request.num_speculative_tokens
    tree = None
    if request.proposal == "chain" and length is not None and length > heads.num_heads:
        raise ProposerError(
            f"drafter {folder} has {heads.num_heads} Medusa heads, so its chains are at most "
            f"{heads.num_heads} tokens long; asked for {length}"
        )
    if request.proposal == "tree":
        tree = request.tree
        if request.published_tree is not None:
            tree = MedusaTree(tuple(tuple(path) for path in request.published_tree["choices"]))
        tree = resolve_medusa_tree(tree or TreeSettings(), heads.num_heads, calibrated_tree(record))

    # built now, so a tree the heads cannot draft is refused before the target is touched;
    # the first request gets it
    built = [MedusaProposer(heads, adapter.num_layers, tree, request.cache)]

    def make() -> Proposer:
        return (
            built.pop() if built else MedusaProposer(heads, adapter.num_layers, tree, request.cache)
        )

    if family_spec(record["family"]).adapts_target:
        merge_adapter(target, adapter_dir(folder))
    return LoadedDrafter(heads, make, tree)
