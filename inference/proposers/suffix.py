"""Suffix decoding (arXiv 2411.04975): drafts from the continuations the text itself repeats.

Two structures count every substring of up to `depth` tokens, with how often each occurred: one
per request over its prompt and output so far (`SuffixTrie`), and one global over the outputs of
earlier requests (`SuffixCache`, bounded by a token budget, oldest request evicted first). Each
round the longest suffix of the context that occurred before *with a continuation* is found in
each structure (binary search on its length: a shorter suffix of a continued match is always
continued too). From that node a tree of the most frequent continuations grows best-first:
a node's score is its empirical probability given the match (the product of its and its
ancestors' continuation frequencies), nodes under `min_token_prob` are never proposed, and the
tree holds at most `max_draft` and at most `spec_factor x match length + spec_offset` tokens, so
longer matches speculate further. The structure whose proposal scores higher (the sum of its
nodes' probabilities: the expected accepted tokens under the counts) drafts the round. A chain
is the most probable path. Drafts are deterministic: verification treats them as one-hot, so
sampling stays exact.

Memory: one node per distinct substring of <= `depth` tokens, at most `depth` new nodes a token
(`SuffixTrie.nodes`): measured 25-27 nodes and about 6.4 KB a token at depth 32 on the testbed's
answers, so the global budget defaults to 100,000 tokens (~0.6 GiB).

arctic-inference's suffix tree (a C++ extension in its sdist) is not a dependency: `pip install
arctic-inference` fails here (its CMake asks the interpreter on PATH for nanobind, not the
build environment's); docs/runtime.md says what builds it by hand.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch

from ..errors import GenerationError
from ..proposer import Proposer
from ..sampling import SamplingParams
from ..tree import Proposal


@dataclass(frozen=True)
class SuffixSettings:
    """How suffix decoding matches and how much it proposes."""

    #: longest substring counted: a match of up to depth - max_draft tokens leaves room for
    #: max_draft tokens of continuation below it
    depth: int = 32
    max_draft: int = 16  # most tokens proposed in a round
    spec_factor: float = 1.0  # proposed tokens <= spec_factor x match length + spec_offset
    spec_offset: float = 0.0
    min_token_prob: float = 0.1  # nodes whose probability given the match is lower: not drafted
    tree: bool = False  # propose a tree of continuations instead of the most probable path
    #: the global cache's budget of earlier outputs' tokens (about 6 KiB each at depth 32:
    #: bench/results/cpu-2026-12-03-suffix-cost)
    max_global_tokens: int = 100_000
    #: a file that keeps the global cache across processes (`suffix_store`); None: memory only
    cache_path: str | None = None

    def __post_init__(self) -> None:
        for name in ("depth", "max_draft", "max_global_tokens"):
            if getattr(self, name) < 1:
                raise GenerationError(f"suffix {name} must be >= 1, got {getattr(self, name)}")
        if self.spec_factor <= 0 and self.spec_offset <= 0:
            raise GenerationError("suffix spec_factor and spec_offset allow no draft token")
        if not 0 <= self.min_token_prob <= 1:
            raise GenerationError(
                f"suffix min_token_prob must be in [0, 1], got {self.min_token_prob}"
            )

    #: as a tree kind (`inference.proposal_settings.TreeKind`): `--tree` alone shapes it
    OPTIONS: ClassVar[tuple] = ()

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SuffixSettings:
        return cls(**record)

    def describe(self) -> str:
        return f"suffix tree (up to {self.max_draft} tokens)"

    @property
    def max_match(self) -> int:
        """The longest suffix matched."""
        return max(1, self.depth - self.max_draft)

    def budget(self, match_length: int) -> int:
        """Tokens a match of `match_length` may propose."""
        return min(self.max_draft, int(self.spec_factor * match_length + self.spec_offset))


class _Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


class SuffixTrie:
    """Occurrence counts of every substring of <= `depth` tokens of the sequences added.

    A sequence grows token by token (`extend`): its open suffixes (the nodes of its last
    0 .. depth - 1 tokens) each gain the new token as a child, so a token costs O(depth)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = _Node()
        self.nodes = 1

    def open(self) -> list[_Node]:
        """The open suffixes of a new, empty sequence."""
        return [self.root]

    def extend(self, suffixes: list[_Node], tokens: Iterable[int]) -> list[_Node]:
        """Append `tokens` to the sequence whose open suffixes are `suffixes`; its new ones."""
        for token in tokens:
            grown = [self.root]
            for node in suffixes:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                    self.nodes += 1
                child.count += 1
                grown.append(child)
            suffixes = grown[: self.depth]
        return suffixes

    def remove(self, tokens: Sequence[int]) -> None:
        """Take one added sequence's counts back out; nodes left with none are dropped."""
        suffixes: list[_Node] = [self.root]
        for token in tokens:
            grown = [self.root]
            for node in suffixes:
                child = node.children.get(token)
                if child is None:  # dropped already: its parent's count reached 0 first
                    continue
                child.count -= 1
                if child.count == 0:
                    del node.children[token]
                    self.nodes -= 1
                grown.append(child)
            suffixes = grown[: self.depth]

    def node(self, tokens: Sequence[int]) -> _Node | None:
        """The node of `tokens`, or None when they never occurred."""
        node = self.root
        for token in tokens:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def match(self, context: Sequence[int], longest: int) -> tuple[int, _Node | None]:
        """(length, node) of the longest suffix of `context`, of at most `longest` tokens,
        that occurred with a continuation; (0, None) when not even its last token did."""
        low, high = 0, min(longest, self.depth - 1, len(context))
        while low < high:  # invariant: the suffix of length `low` is continued (or low = 0)
            middle = (low + high + 1) // 2
            node = self.node(context[len(context) - middle :])
            if node is not None and node.children:
                low = middle
            else:
                high = middle - 1
        if low == 0:
            return 0, None
        return low, self.node(context[len(context) - low :])


@dataclass
class Speculation:
    """A proposal grown from a match, with its score."""

    tokens: list[int]
    parents: list[int]
    score: float  # the sum of its nodes' probabilities given the match
    match_length: int


def speculate(node: _Node, match_length: int, settings: SuffixSettings, depth: int) -> Speculation:
    """The most probable continuations of `node`: a tree grown best-first (or the most probable
    path) of at most `settings.budget(match_length)` tokens and `depth` levels."""
    budget = settings.budget(match_length)
    speculation = Speculation([], [], 0.0, match_length)
    order = itertools.count()  # ties: first pushed first
    candidates: list = []  # (-probability, tie, token, node, parent index, level)

    def offer(parent: _Node, probability: float, index: int, level: int) -> None:
        total = sum(child.count for child in parent.children.values())
        if level > depth or total == 0:
            return
        ranked = sorted(parent.children.items(), key=lambda kv: -kv[1].count)
        for token, child in ranked if settings.tree else ranked[:1]:
            share = probability * child.count / total
            heapq.heappush(candidates, (-share, next(order), token, child, index, level))

    offer(node, 1.0, -1, 1)
    while candidates and len(speculation.tokens) < budget:
        negative, _, token, child, parent, level = heapq.heappop(candidates)
        if -negative < settings.min_token_prob:
            break  # every other candidate is no more probable
        speculation.tokens.append(token)
        speculation.parents.append(parent)
        speculation.score += -negative
        offer(child, -negative, len(speculation.tokens) - 1, level + 1)
    return speculation


class SuffixCache:
    """The global structure: earlier requests' outputs, oldest evicted first once their tokens
    pass `max_tokens`. Shared by every proposer given it (one per request in a batch)."""

    def __init__(self, depth: int = 32, max_tokens: int = 100_000) -> None:
        self.trie = SuffixTrie(depth)
        self.max_tokens = max_tokens
        self.held: deque[tuple[int, ...]] = deque()
        self.tokens = 0

    def clear(self) -> None:
        """Forget every output."""
        self.trie = SuffixTrie(self.trie.depth)
        self.held.clear()
        self.tokens = 0

    def add(self, output: Sequence[int]) -> None:
        """Count one finished request's output; evict the oldest outputs past the budget."""
        output = tuple(output)[-self.max_tokens :]
        if not output:
            return
        self.trie.extend(self.trie.open(), output)
        self.held.append(output)
        self.tokens += len(output)
        while self.tokens > self.max_tokens:
            oldest = self.held.popleft()
            self.trie.remove(oldest)
            self.tokens -= len(oldest)


class SuffixProposer(Proposer):
    """Suffix decoding over the request so far and, when given, a global `SuffixCache`."""

    def __init__(self, settings: SuffixSettings | None = None, cache: SuffixCache | None = None):
        self.settings = settings or SuffixSettings()
        if cache is not None and cache.trie.depth != self.settings.depth:
            raise GenerationError(
                f"the global suffix cache counts substrings of {cache.trie.depth} tokens, the "
                f"proposer matches {self.settings.depth}"
            )
        self.cache = cache
        self.reset()

    def reset(self) -> None:
        """A new request: an empty request structure."""
        self.request = SuffixTrie(self.settings.depth)
        self._suffixes = self.request.open()
        self._seen = 0  # context tokens counted so far
        self._prompt: int | None = None  # the prompt's length (known at the first round)

    def finish(self, token_ids: list[int]) -> None:
        """The request is done: its output joins the global cache."""
        if self.cache is not None and self._prompt is not None:
            self.cache.add(token_ids[self._prompt :])

    def update(self, context: list[int]) -> None:
        """Count the context's tokens not counted yet (a request's first call: its prompt)."""
        if self._prompt is None:
            self._prompt = len(context)  # the first round drafts the first output token
        self._suffixes = self.request.extend(self._suffixes, context[self._seen :])
        self._seen = len(context)

    def speculation(self, context: list[int], max_tokens: int) -> Speculation | None:
        """The better-scoring proposal of the request's and the global structure (the
        request's structure already counts `context`)."""
        best = None
        for trie in (self.request, self.cache.trie if self.cache is not None else None):
            if trie is None:
                continue
            length, node = trie.match(context, self.settings.max_match)
            if node is None:
                continue
            found = speculate(node, length, self.settings, max_tokens)
            if found.tokens and (best is None or found.score > best.score):
                best = found
        return best

    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Proposal:
        self.update(context)
        found = self.speculation(context, max_tokens) if max_tokens > 0 else None
        if found is None:
            return Proposal.chain([])
        return Proposal(found.tokens, found.parents)
