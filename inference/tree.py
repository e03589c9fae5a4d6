"""Proposals: a chain or a tree of draft tokens, and the attention layout that verifies them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Proposal:
    """Draft tokens as a tree; a chain is the tree whose node i has parent i - 1.

    Node indices are 0..n-1; parent -1 is the root, i.e. the last committed token whose target
    distribution the verification forward computes first.
    """

    tokens: list[int]
    parents: list[int]
    #: q_i: the distribution node i was sampled from, [n, vocab]; None for deterministic
    #: proposers (prompt lookup, greedy drafting), which verification treats as one-hot.
    draft_probs: torch.Tensor | None = None
    children: list[list[int]] = field(init=False)
    depths: list[int] = field(init=False)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents must have the same length")
        self.children = [[] for _ in range(len(self.tokens) + 1)]  # slot 0 = root
        self.depths = []
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise ValueError(f"node {i} has parent {parent}; parents must precede children")
            self.children[parent + 1].append(i)
            self.depths.append(1 if parent < 0 else self.depths[parent] + 1)

    @classmethod
    def chain(cls, tokens: list[int], draft_probs: torch.Tensor | None = None) -> Proposal:
        """A linear proposal d_1 -> d_2 -> ..."""
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), draft_probs)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return self.parents == list(range(-1, len(self.tokens) - 1))

    def ancestor_mask(self) -> torch.Tensor:
        """[n+1, n+1] bool: slot a attends slot b (slot 0 = root, slot i+1 = node i)."""
        size = len(self.tokens) + 1
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
