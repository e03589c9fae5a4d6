"""Static trees over per-position candidates, for drafters that compute every drafted position's
distribution at once, independently of the tokens drafted before it (Medusa's heads read one
state; DFlash's block reads mask tokens after the anchor).

A tree is Medusa's `medusa_choices`: a path (i_1, ..., i_d) is the node under the node of the
path without its last index whose token is, at T = 0, position d's i_d-th most likely token; at
T > 0, the i_d-th of `top_k` tokens drawn i.i.d. from position d's q_d, with q_d returned. Since
a position's q does not depend on the node above, every node's children are i.i.d. draws from
the q they are verified against, and recursive rejection over siblings keeps the output
distributed as the target's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ...architectures.tree_search import calibrated_choices, estimated_acceptance
from ..sampling import SamplingParams, gumbel_pick, probabilities
from ..setting_flag import SettingFlag
from ..tree import Proposal

#: a sparse 16-node tree 4 positions deep: wide near the root, one path deep
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


def _rank(value) -> int:
    """One rank of a tree path: a JSON integer (not 1.0, 1e400 or true)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"rank {value!r} is not an integer")
    return value


def parse_choices(text: str) -> tuple[tuple[int, ...], ...]:
    """--tree-choices: JSON paths of non-negative ranks, every path's parent listed."""
    try:
        paths = json.loads(text)
        if not isinstance(paths, list) or not paths:
            raise ValueError("not a list of paths")
        return PositionTree(tuple(tuple(_rank(r) for r in path) for path in paths)).choices
    except (ValueError, TypeError, RecursionError) as err:
        raise argparse.ArgumentTypeError(
            f"not a tree of rank paths like [[0],[1],[0,0]] ({err}): {text!r}"
        ) from err


@dataclass(frozen=True)
class PositionTree:
    """A static tree: paths of per-position top-k indices (Medusa's `medusa_choices`; a tree
    kind: `inference.proposal_settings.TreeKind`)."""

    OPTIONS: ClassVar[tuple[SettingFlag, ...]] = (
        SettingFlag(
            "--tree-choices",
            "choices",
            parse_choices,
            "Medusa and DFlash: a static tree over the drafted positions' candidates, as JSON "
            "paths of per-position ranks (Medusa's medusa_choices), e.g. '[[0],[1],[0,0]]' "
            "(default: the drafter's calibrated tree, else a 16-node tree)",
        ),
    )

    choices: tuple[tuple[int, ...], ...] = DEFAULT_CHOICES

    def __post_init__(self) -> None:
        paths = [tuple(p) for p in self.choices]
        if not paths or any(not p or min(p) < 0 for p in paths):
            raise ValueError("a position tree is a non-empty list of non-empty index paths >= 0")
        if len(set(paths)) != len(paths):
            raise ValueError("a position tree lists a path twice")
        missing = sorted({p[:-1] for p in paths if len(p) > 1} - set(paths))
        if missing:
            raise ValueError(f"a position tree needs every path's parent; missing {missing}")
        object.__setattr__(self, "choices", tuple(sorted(paths, key=lambda p: (len(p), p))))

    def record(self) -> dict[str, Any]:
        return {"choices": [list(path) for path in self.choices]}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> PositionTree:
        if set(record) != {"choices"} or not isinstance(record["choices"], list | tuple):
            raise ValueError(f"a position tree is {{'choices': [[rank, ...], ...]}}, got {record}")
        return cls(tuple(tuple(path) for path in record["choices"]))

    def describe(self) -> str:
        return f"tree ({len(self.choices)} nodes)"

    @classmethod
    def default(cls, positions: int) -> PositionTree:
        """`DEFAULT_CHOICES` without the paths deeper than `positions`."""
        return cls(tuple(p for p in DEFAULT_CHOICES if len(p) <= positions))

    @classmethod
    def calibrated(cls, rank_accuracy: Sequence[Sequence[float]], nodes: int) -> PositionTree:
        """The `nodes` paths with the highest estimated acceptance given each position's
        measured rank accuracies (`architectures.tree_search`)."""
        return cls(tuple(calibrated_choices(rank_accuracy, nodes)))

    def estimated_acceptance(self, rank_accuracy: Sequence[Sequence[float]]) -> float:
        """Expected tokens per round under per-position independence."""
        return estimated_acceptance(self.choices, rank_accuracy)

    @property
    def depth(self) -> int:
        """The longest path: the positions it needs."""
        return max(len(p) for p in self.choices)

    @property
    def top_k(self) -> int:
        """Candidates each position must rank."""
        return 1 + max(max(p) for p in self.choices)

    def layout(self, depth: int, width: int) -> tuple[list[int], list[int]]:
        """(where each node's token sits in a flattened [positions, width] table, its parent)
        for the tree's nodes up to `depth`."""
        index: dict[tuple[int, ...], int] = {}
        cells, parents = [], []
        for path in self.choices:
            if len(path) > depth:
                continue
            index[path] = len(cells)
            cells.append((len(path) - 1) * width + path[-1])
            parents.append(index[path[:-1]] if len(path) > 1 else -1)
        return cells, parents


def resolve_position_tree(
    tree: Any, positions: int, calibrated: PositionTree | None = None
) -> PositionTree:
    """The tree to draft: a `PositionTree` as given; otherwise (the family's own tree asked
    for) the drafter's `calibrated` tree, else the default tree cut to `positions`."""
    if isinstance(tree, PositionTree):
        return tree
    return calibrated if calibrated is not None else PositionTree.default(positions)


class TreeDraw:
    """Drafts a chain (no tree) or a `PositionTree` from per-position logits [depth, V]."""

    def __init__(self, tree: PositionTree | None, device: torch.device) -> None:
        self.tree, self.device = tree, device
        #: per depth: the tree's cells in the [depth, top_k] ranking, parents, node positions
        self._layouts: dict[int, tuple[torch.Tensor, list[int], torch.Tensor]] = {}

    @property
    def width(self) -> int:
        """Candidates ranked (or drawn) per position."""
        return self.tree.top_k if self.tree is not None else 1

    def uniforms(self, depth, vocab, params: SamplingParams, generator) -> torch.Tensor | None:
        """T > 0: the uniforms of `width` i.i.d. draws from each position's q."""
        if params.greedy:
            return None
        shape = (depth, self.width, vocab)
        return torch.rand(shape, generator=generator, device=self.device)

    def draft(self, logits: torch.Tensor, params: SamplingParams, uniforms):
        """The tokens [nodes] and, at T > 0, each node's position's q [nodes, V]."""
        q = None
        if params.greedy and self.tree is None:
            ranked = logits.argmax(-1, keepdim=True)  # [depth, 1]
        elif params.greedy:
            ranked = logits.topk(self.width, dim=-1).indices  # [depth, width], best first
        else:
            q = probabilities(logits, params)  # each position's own q
            ranked = gumbel_pick(q[:, None].expand(-1, self.width, -1), uniforms)
        if self.tree is None:
            return ranked[:, 0], q
        cells, _, node_positions = self.layout(len(logits))
        tokens = ranked.reshape(-1).index_select(0, cells)
        return tokens, None if q is None else q.index_select(0, node_positions)

    def proposal(self, tokens: torch.Tensor, q: torch.Tensor | None, depth: int) -> Proposal:
        """What `draft` gave, as the chain or tree it is (read with the verification)."""
        if self.tree is None:
            return Proposal.chain(tokens, q)
        return Proposal(tokens, self.layout(depth)[1], q)

    def layout(self, depth: int) -> tuple[torch.Tensor, list[int], torch.Tensor]:
        if depth not in self._layouts:
            cells, parents = self.tree.layout(depth, self.tree.top_k)
            positions: list[int] = []  # a node's position: its depth - 1
            for parent in parents:
                positions.append(0 if parent < 0 else positions[parent] + 1)
            self._layouts[depth] = (
                torch.tensor(cells, device=self.device),
                parents,
                torch.tensor(positions, device=self.device),
            )
        return self._layouts[depth]
