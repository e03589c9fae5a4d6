"""Proposals: a chain or a tree of draft tokens, the attention layout that verifies them, and
EAGLE-2's dynamic-tree budget."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch

from .errors import GenerationError
from .setting_flag import SettingFlag
from .transfer import to_device


class Proposal:
    """Draft tokens as a tree; a chain is the tree whose node i has parent i - 1.

    Node indices are 0..n-1; parent -1 is the root, i.e. the last committed token whose target
    distribution the verification forward computes first.

    `tokens` may be a device tensor [n] (a proposer that drafted on the device): verification
    then builds its input on the device and reads the tokens with the target's answer, in the
    round's one host read (`read_with`); `tokens` reads them on first use otherwise. A tree
    drafted on the device may keep its `parents` there too, with its verification `layout`
    (`tree_layout`): they come back in that same read.
    """

    def __init__(
        self,
        tokens: list[int] | torch.Tensor,
        parents: list[int] | torch.Tensor,
        draft_probs: torch.Tensor | None = None,
        layout: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        if len(tokens) != len(parents):
            raise ValueError("tokens and parents must have the same length")
        on_device = isinstance(tokens, torch.Tensor)
        #: the tokens as drafted on the device [n], or None
        self.device_tokens: torch.Tensor | None = tokens if on_device else None
        self._tokens: list[int] | None = None if on_device else list(tokens)
        #: a device tree's parents [n] and (depths [n+1], ancestors [n+1, n+1]), or None
        self.device_parents: torch.Tensor | None = None
        self.device_layout = layout
        #: q_i: the distribution node i was sampled from, [n, vocab]; None for deterministic
        #: proposers (prompt lookup, greedy drafting), which verification treats as one-hot.
        self.draft_probs = draft_probs
        self._parents: list[int] | None = None
        if isinstance(parents, torch.Tensor):
            if layout is None or not on_device:
                raise ValueError(
                    "parents on the device come with the tokens there and their layout "
                    "(tree_layout)"
                )
            self.device_parents = parents
        else:
            self._set_parents(list(parents))

    def _set_parents(self, parents: list[int]) -> None:
        self._parents = parents
        self._children: list[list[int]] = [[] for _ in range(len(parents) + 1)]  # slot 0 = root
        self._depths: list[int] = []
        for i, parent in enumerate(parents):
            if not -1 <= parent < i:
                raise ValueError(f"node {i} has parent {parent}; parents must precede children")
            self._children[parent + 1].append(i)
            self._depths.append(1 if parent < 0 else self._depths[parent] + 1)

    @classmethod
    def chain(
        cls, tokens: list[int] | torch.Tensor, draft_probs: torch.Tensor | None = None
    ) -> Proposal:
        """A linear proposal d_1 -> d_2 -> ..."""
        return cls(tokens, list(range(-1, len(tokens) - 1)), draft_probs)

    @property
    def tokens(self) -> list[int]:
        """The draft token ids (read from the device on first use when drafted there)."""
        if self._tokens is None:
            self._tokens = self.device_tokens.tolist()
        return self._tokens

    def _read_layout(self) -> None:
        if self._parents is None:
            self._set_parents(self.device_parents.tolist())

    @property
    def parents(self) -> list[int]:
        """Each node's parent (-1 = the root); read from the device on first use."""
        self._read_layout()
        return self._parents

    @property
    def children(self) -> list[list[int]]:
        """Each slot's child nodes (slot 0 = the root, slot i + 1 = node i)."""
        self._read_layout()
        return self._children

    @property
    def depths(self) -> list[int]:
        """Each node's depth (the root's children: 1)."""
        self._read_layout()
        return self._depths

    @property
    def tree_on_device(self) -> bool:
        """A tree whose parents are still on the device (greedy acceptance stays there)."""
        return self._parents is None

    @property
    def unread(self) -> bool:
        """Drafted on the device (tokens, or a tree's parents) and not read back yet."""
        return self._tokens is None or self._parents is None

    def on_device(self) -> list[torch.Tensor]:
        """What is still to be read: the tokens, then a tree's parents, where still there."""
        parts = [self.device_tokens] if self._tokens is None else []
        return parts + ([self.device_parents] if self._parents is None else [])

    def take(self, read: list[int]) -> list[int]:
        """Take the values of `on_device`, read elsewhere, from the front of `read`; the rest."""
        n = len(self)
        if self._tokens is None:
            self._tokens, read = read[:n], read[n:]
        if self._parents is None:
            self._set_parents(read[:n])
            read = read[n:]
        return read

    def read_with(self, values: torch.Tensor) -> list[int]:
        """Read what is still on the device together with `values` (one host read); `values`
        as a list."""
        return self.take(torch.cat([*(p.long() for p in self.on_device()), values.long()]).tolist())

    def verification_input(self, root: int, device) -> torch.Tensor:
        """[1, n + 1]: the root then the draft tokens, built on the device when drafted there."""
        if self._tokens is None:
            root_id = to_device([root], device, self.device_tokens.dtype)
            return torch.cat([root_id, self.device_tokens.to(device)])[None]
        return to_device([[root, *self.tokens]], device)

    def layout(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(depths [n+1] from the root, ancestor mask [n+1, n+1]) on `device`: the device
        tree's own, or copied there."""
        if self.device_layout is not None:
            depths, ancestors = self.device_layout
            return depths.to(device), ancestors.to(device)
        return to_device([0, *self.depths], device), to_device(self.ancestor_mask(), device)

    def __len__(self) -> int:
        return len(self._parents) if self._parents is not None else len(self.device_parents)

    @property
    def is_chain(self) -> bool:
        """A chain (a device tree, unread, is taken as a tree)."""
        if self._parents is None:
            return False
        return self._parents == list(range(-1, len(self._parents) - 1))

    def ancestor_mask(self) -> torch.Tensor:
        """[n+1, n+1] bool: slot a attends slot b (slot 0 = root, slot i+1 = node i)."""
        size = len(self.parents) + 1
        mask = torch.zeros(size, size, dtype=torch.bool)
        mask[:, 0] = True
        for i, parent in enumerate(self.parents):
            slot = i + 1
            mask[slot, slot] = True
            if parent >= 0:
                mask[slot] |= mask[parent + 1]
        return mask

    def path_to(self, node: int) -> list[int]:
        """Nodes from the root's child down to `node`."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


def tree_layout(parents: torch.Tensor, max_depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`Proposal.ancestor_mask` and the slots' depths computed on the parents' device, for a
    tree no deeper than `max_depth`: (depths [n+1], ancestors [n+1, n+1] bool)."""
    n = parents.shape[0]
    device = parents.device
    parent_slot = torch.cat([torch.zeros(1, dtype=torch.long, device=device), parents + 1])
    slots = torch.arange(n + 1, device=device)
    # comparisons, not writes of a host `True` (a copy from the host no CUDA graph can capture)
    ancestors = slots[:, None] == slots[None, :]
    above = slots
    for _ in range(max_depth):  # one step up per level: the root is its own parent
        above = parent_slot.index_select(0, above)
        ancestors = ancestors | (slots[None, :] == above[:, None])
    return ancestors.sum(-1) - 1, ancestors


#: the largest tree budget accepted: each bound far above what EAGLE-2 uses, and far below
#: what a verification forward could not hold
TREE_LIMITS = {"top_k": 256, "depth": 64, "total_tokens": 2048, "sampled_children": 256}


@dataclass(frozen=True)
class TreeSettings:
    """EAGLE-2 dynamic-tree budget (a tree kind: `inference.proposal_settings.TreeKind`)."""

    OPTIONS: ClassVar[tuple[SettingFlag, ...]] = (
        SettingFlag("--tree-top-k", "top_k", int, "EAGLE-2: children per node (default 10)"),
        SettingFlag("--tree-depth", "depth", int, "EAGLE-2: maximum depth (default 6)"),
        SettingFlag(
            "--tree-tokens", "total_tokens", int, "EAGLE-2: draft tokens kept (default 60)"
        ),
        SettingFlag(
            "--tree-sampled-children",
            "sampled_children",
            int,
            "EAGLE-2 at T > 0: children sampled (without replacement) per expanded node "
            "(default 3)",
        ),
    )

    top_k: int = 10  # the frontier width (nodes expanded per depth); T = 0: children scored
    depth: int = 6  # maximum tree depth (draft tokens on one path)
    total_tokens: int = 60  # draft tokens kept for verification
    sampled_children: int = 3  # T > 0: children drawn per expanded node

    def __post_init__(self) -> None:
        if min(self.top_k, self.depth, self.total_tokens, self.sampled_children) < 1:
            raise GenerationError(
                "tree top_k, depth, total_tokens and sampled_children must be >= 1"
            )
        for name, most in TREE_LIMITS.items():
            if getattr(self, name) > most:
                raise GenerationError(
                    f"tree {name} {getattr(self, name)} is over {most}: a verification tree that "
                    "size would not fit a forward (EAGLE-2 uses top_k 10, depth 6, 60 tokens)"
                )

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> TreeSettings:
        return cls(**record)

    def describe(self) -> str:
        return f"dynamic tree ({self.total_tokens} tokens, depth {self.depth})"
