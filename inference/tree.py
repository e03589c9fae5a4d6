"""Proposals: a chain or a tree of draft tokens, the attention layout that verifies them, and
EAGLE-2's dynamic-tree budget."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .transfer import to_device


class Proposal:
    """Draft tokens as a tree; a chain is the tree whose node i has parent i - 1.

    Node indices are 0..n-1; parent -1 is the root, i.e. the last committed token whose target
    distribution the verification forward computes first.

    `tokens` may be a device tensor [n] (a proposer that drafted on the device): verification
    then builds its input on the device and reads the tokens with the target's answer, in the
    round's one host read (`read_with`); `tokens` reads them on first use otherwise.
    """

    def __init__(
        self,
        tokens: list[int] | torch.Tensor,
        parents: list[int],
        draft_probs: torch.Tensor | None = None,
    ) -> None:
        if len(tokens) != len(parents):
            raise ValueError("tokens and parents must have the same length")
        on_device = isinstance(tokens, torch.Tensor)
        #: the tokens as drafted on the device [n], or None
        self.device_tokens: torch.Tensor | None = tokens if on_device else None
        self._tokens: list[int] | None = None if on_device else list(tokens)
        self.parents = list(parents)
        #: q_i: the distribution node i was sampled from, [n, vocab]; None for deterministic
        #: proposers (prompt lookup, greedy drafting), which verification treats as one-hot.
        self.draft_probs = draft_probs
        self.children: list[list[int]] = [[] for _ in range(len(parents) + 1)]  # slot 0 = root
        self.depths: list[int] = []
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise ValueError(f"node {i} has parent {parent}; parents must precede children")
            self.children[parent + 1].append(i)
            self.depths.append(1 if parent < 0 else self.depths[parent] + 1)

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

    @property
    def unread(self) -> bool:
        """Drafted on the device and not read back yet."""
        return self._tokens is None

    def read_with(self, values: torch.Tensor) -> list[int]:
        """Read the device tokens together with `values` (one host read); `values` as a list."""
        both = torch.cat([self.device_tokens, values.to(self.device_tokens.dtype)]).tolist()
        self._tokens = both[: len(self.parents)]
        return both[len(self.parents) :]

    def verification_input(self, root: int, device) -> torch.Tensor:
        """[1, n + 1]: the root then the draft tokens, built on the device when drafted there."""
        if self.unread:
            root_id = to_device([root], device, self.device_tokens.dtype)
            return torch.cat([root_id, self.device_tokens.to(device)])[None]
        return to_device([[root, *self.tokens]], device)

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def is_chain(self) -> bool:
        return self.parents == list(range(-1, len(self.parents) - 1))

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


@dataclass(frozen=True)
class TreeSettings:
    """EAGLE-2 dynamic-tree budget."""

    top_k: int = 10  # the frontier width (nodes expanded per depth); T = 0: children scored
    depth: int = 6  # maximum tree depth (draft tokens on one path)
    total_tokens: int = 60  # draft tokens kept for verification
    sampled_children: int = 3  # T > 0: children drawn per expanded node

    def __post_init__(self) -> None:
        if min(self.top_k, self.depth, self.total_tokens, self.sampled_children) < 1:
            raise ValueError("tree top_k, depth, total_tokens and sampled_children must be >= 1")
