"""EAGLE proposers: chain drafting and EAGLE-2 dynamic trees over the drafter's own cache.

The generate loops hand the proposer the target's states at the drafter's layers for every
committed position (`observe`): the prefill's, then after each verification the root's and the
accepted nodes'. `propose` first feeds the pending (state, next token) pairs into the drafter's
cache — these entries are real and stay — then drafts on top of them; whatever it drafted is
cropped away before it returns, so the next round starts from real entries only.

Chain: greedy (T=0) or sampled from the drafter's distribution q (T>0, q returned for lossless
acceptance). Tree (EAGLE-2): the root's top_k children start the frontier; each of `depth - 1`
rounds feeds the frontier in one drafter forward (each node sees the real cache, its ancestors
and itself), scores every child by cumulative draft log-probability, and keeps the top_k
children as the next frontier; at the end the best `total_tokens` of all scored candidates form
the tree (a child never outranks its parent, so they form a connected tree). At T=0 these
deterministic candidates are the tree.

At T>0 the tree is *sampled*: every expanded node gets `sampled_children` children drawn from q
without replacement (child i from q with the earlier siblings removed and renormalised, which is
the q_i its acceptance test uses: SpecInfer's recursive rejection, without replacement); each
depth expands the `top_k` best nodes of the previous one by cumulative draft log-probability
(the frontier width, as at T=0), within `total_tokens`. No sampled node is dropped after it is
drawn — which nodes get children depends only on nodes already drawn — so every node is
distributed as its q_i says and sampling stays lossless. Deterministic top-k siblings would be
lossless too, but each is accepted only with the target's own probability of it, which at T=1
gains nothing over a sampled chain (whose acceptance is the overlap of p and q, however flat
both are).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ..architectures.eagle import DraftCache, EagleDrafter, load_eagle
from ..architectures.target import TargetAdapter
from .cache_settings import GROWING, CacheSettings
from .drafter_request import DrafterRequest, LoadedDrafter
from .eagle_static import StaticEagle
from .proposers import Proposer, ProposerError
from .sampling import SamplingParams, probabilities, sample
from .transfer import to_device
from .tree import Proposal, TreeSettings


class EagleProposer(Proposer):
    """Drafts with an EAGLE-1/3 drafter; a chain, or an EAGLE-2 tree when `tree` is given.

    A static `cache`: the drafter's cache is preallocated for its `max_length` positions, and
    each round's catch-up, chain and greedy tree replay as CUDA graphs on CUDA
    (`eagle_static.py`); sampled trees draft eagerly on its scratch slots."""

    def __init__(
        self,
        drafter: EagleDrafter,
        tree: TreeSettings | None = None,
        cache: CacheSettings = GROWING,
    ) -> None:
        self.drafter = drafter.eval()
        self.tree = tree
        self.static = None
        if cache.static:
            self.static = StaticEagle(drafter, cache.max_length, cache.cuda_graphs, tree=tree)
        self.target_layers = tuple(drafter.layers)
        self.device = drafter.fc.weight.device
        self.dtype = drafter.fc.weight.dtype
        #: the target id of every draft id (`to_target_list`: the same on the host)
        self.to_target = drafter.to_target_ids(
            torch.arange(drafter.draft_vocab_size, device=self.device)
        )
        self.reset()

    @functools.cached_property
    def to_target_list(self) -> list[int]:
        """`to_target` on the host, read on first use (eager drafting's lookups)."""
        return self.to_target.tolist()

    @classmethod
    def from_pretrained(
        cls, path: str | Path, target, tokenizer=None, tree: TreeSettings | None = None
    ) -> EagleProposer:
        """Load a drafter folder for `target` (a transformers causal LM), checked against it."""
        adapter = TargetAdapter(target, tokenizer)
        return cls(load_eagle(Path(path), adapter, dtype=target.dtype), tree)

    def reset(self) -> None:
        """Forget the request: empty cache, no pending states."""
        self.cache = DraftCache()
        self.fed = 0  # real positions in the cache
        self.pending: list[torch.Tensor] = []  # [n, k*h] target states not yet fed
        if self.static is not None:
            self.static.reset()

    def cache_nbytes(self) -> int:
        """Bytes held by the drafter's KV cache."""
        return self.static.nbytes() if self.static is not None else self.cache.nbytes()

    def observe(self, states: torch.Tensor) -> None:
        """Target states [n, k*h] of the next n committed positions."""
        if len(states):
            self.pending.append(states.to(self.device, self.dtype))

    # -- feeding the real context --------------------------------------------------------
    def _catch_up(self, context: list[int]) -> torch.Tensor | None:
        """Feed pending states with their next tokens; the last real output [1, 1, h]
        (None for a one-token prompt, which has no state to draft from yet)."""
        if not self.pending:
            if len(context) == 1:
                return None
            raise RuntimeError("EagleProposer.propose called with no new target states")
        states = torch.cat(self.pending)[None]
        self.pending = []
        n = states.shape[1]
        if self.fed + n != len(context) - 1:
            raise RuntimeError(
                f"target states cover {self.fed + n} positions, the context has {len(context)} "
                "tokens; every committed position but the last needs its state"
            )
        ids = to_device([context[self.fed + 1 : self.fed + n + 1]], self.device)
        if self.static is not None:
            self.fed += n
            return self.static.feed(ids, states)
        positions = torch.arange(self.fed, self.fed + n, device=self.device)[None]
        total = len(self.cache) + n
        mask = torch.ones(n, total, dtype=torch.bool, device=self.device).tril(total - n)
        hidden = self.drafter.extend(
            ids, self.drafter.fuse(states), positions, self.cache, mask[None, None]
        )
        self.fed += n
        return hidden[:, -1:]

    @torch.no_grad()
    def propose(
        self,
        context: list[int],
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Proposal:
        last = self._catch_up(context)
        if max_tokens <= 0 or last is None:
            return Proposal.chain([])
        if self.static is not None and self.tree is None:
            tokens, draft_probs = self.static.draft(last, max_tokens, params, generator)
            return Proposal.chain(tokens, draft_probs)  # read with the verification
        if self.static is not None and params.greedy:
            tokens, parents, depths, ancestors = self.static.tree(last, self.tree, max_tokens)
            return Proposal(tokens, parents, layout=(depths, ancestors))  # read when verified
        if self.static is not None:  # sampled trees: eagerly, on the scratch slots
            self.cache = self.static.growing_view()
        try:
            if self.tree is not None and params.greedy:
                return self._tree(last, max_tokens)
            if self.tree is not None:
                return self._sampled_tree(last, max_tokens, params, generator)
            return self._chain(last, max_tokens, params, generator)
        finally:
            self.cache.crop(self.fed)

    # -- chain ---------------------------------------------------------------------------
    def _chain(self, last, max_tokens, params, generator) -> Proposal:
        drafter = self.drafter
        target_of = self.to_target_list
        tokens: list[int] = []
        qs = []
        for step in range(max_tokens):
            logits = drafter.logits(last)[0, -1].float()
            if params.greedy:
                draft_id = int(logits.argmax())
            else:
                q = probabilities(logits, params)
                draft_id = sample(q, generator)
                qs.append(q)
            tokens.append(target_of[draft_id])
            if step + 1 == max_tokens:
                break
            ids = torch.tensor([[tokens[-1]]], device=self.device)
            positions = torch.tensor([[self.fed + step]], device=self.device)
            # one drafted token sees the whole cache: the real context and the earlier drafts
            last = drafter.extend(ids, last, positions, self.cache, None)
        if params.greedy:
            return Proposal.chain(tokens)
        draft_probs = torch.zeros(len(qs), drafter.fields["vocab_size"], device=self.device)
        draft_probs[:, self.to_target] = torch.stack(qs)
        return Proposal.chain(tokens, draft_probs)

    # -- EAGLE-2 dynamic tree -----------------------------------------------------------
    def _tree(self, root_hidden: torch.Tensor, max_depth: int) -> Proposal:
        drafter, settings = self.drafter, self.tree
        depth_limit = min(settings.depth, max_depth)
        # candidates: target token, parent candidate (-1 = root), score, depth
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        slot_of: dict[int, int] = {}  # candidate -> its cache slot once fed
        logp = torch.log_softmax(drafter.logits(root_hidden)[0, -1:].float(), dim=-1)
        (frontier,) = self._children(logp, [-1], tokens, parents, scores, settings.top_k)
        hidden_of = {c: root_hidden[0, 0] for c in frontier}
        for depth in range(2, depth_limit + 1):
            out = self._feed(frontier, tokens, parents, hidden_of, slot_of, depth - 1)
            logps = torch.log_softmax(drafter.logits(out)[0].float(), dim=-1)
            children: list[int] = []
            per_row = self._children(logps, frontier, tokens, parents, scores, settings.top_k)
            for row, new in enumerate(per_row):
                for child in new:
                    hidden_of[child] = out[0, row]
                children += new
            children.sort(key=lambda c: (-scores[c], c))
            frontier = children[: settings.top_k]
        keep = sorted(range(len(tokens)), key=lambda c: (-scores[c], c))[: settings.total_tokens]
        keep.sort()  # creation order: parents precede children
        index = {c: i for i, c in enumerate(keep)}
        return Proposal(
            [tokens[c] for c in keep], [index[parents[c]] if parents[c] >= 0 else -1 for c in keep]
        )

    def _feed(self, nodes, tokens, parents, hidden_of, slot_of, depth) -> torch.Tensor:
        """One drafter forward over tree `nodes` (all at `depth`): each sees the real cache,
        its fed ancestors and itself. Returns their outputs [1, len(nodes), h]."""
        base = len(self.cache)
        ids = torch.tensor([[tokens[c] for c in nodes]], device=self.device)
        g = torch.stack([hidden_of[c] for c in nodes])[None]
        positions = torch.full_like(ids, self.fed + depth - 1)
        mask = torch.zeros(1, 1, len(nodes), base + len(nodes), dtype=torch.bool)
        mask[..., : self.fed] = True
        rows: list[int] = []
        columns: list[int] = []
        for row, c in enumerate(nodes):
            slot_of[c] = base + row
            rows.append(row)
            columns.append(base + row)
            ancestor = parents[c]
            while ancestor >= 0:
                rows.append(row)
                columns.append(slot_of[ancestor])
                ancestor = parents[ancestor]
        mask[0, 0, rows, columns] = True
        return self.drafter.extend(ids, g, positions, self.cache, mask.to(self.device))

    def _sampled_tree(self, root_hidden, max_depth, params, generator) -> Proposal:
        drafter, settings = self.drafter, self.tree
        width = settings.sampled_children
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        probs: list[torch.Tensor] = []
        slot_of: dict[int, int] = {}
        q = probabilities(drafter.logits(root_hidden)[0, -1].float(), params)
        budget = settings.total_tokens
        frontier = self._sample_children(
            q, -1, 0.0, min(width, budget), generator, tokens, parents, scores, probs
        )
        budget -= min(width, budget)
        hidden_of = {c: root_hidden[0, 0] for c in frontier}
        for depth in range(2, min(settings.depth, max_depth) + 1):
            # the top_k best nodes of the last depth get `width` children each while the budget
            # lasts (the last one what is left): counts fixed before any child is drawn
            expand = sorted(frontier, key=lambda c: (-scores[c], c))[: -(-budget // width)]
            expand = expand[: settings.top_k]
            if not expand:
                break
            out = self._feed(expand, tokens, parents, hidden_of, slot_of, depth - 1)
            qs = probabilities(drafter.logits(out)[0].float(), params)
            frontier = []
            for row, c in enumerate(expand):
                count = min(width, budget)
                new = self._sample_children(
                    qs[row], c, scores[c], count, generator, tokens, parents, scores, probs
                )
                budget -= count
                for child in new:
                    hidden_of[child] = out[0, row]
                frontier += new
        return Proposal(tokens, parents, torch.stack(probs))

    def _sample_children(
        self, q, parent, parent_score, k, generator, tokens, parents, scores, probs
    ) -> list[int]:
        """Draw up to k children of `parent` from q (draft vocabulary) without replacement;
        child i records q_i (q without the earlier siblings, renormalised) over the target
        vocabulary.

        One Gumbel-top-k draw: the order of the k largest log q + Gumbel keys is distributed as
        k sequential draws without replacement (Kool et al., 2019)."""
        k = min(k, int((q > 0).sum()))
        if k == 0:
            return []
        uniform = torch.rand(q.shape, generator=generator, device=q.device).clamp_min(1e-20)
        order = (q.log() - (-uniform.log()).log()).topk(k).indices  # draft ids, draw order
        taken = q[order]
        q_rows = q.expand(k, -1).clone()
        earlier = torch.ones(k, k, dtype=torch.bool, device=q.device).tril(-1)
        rows, cols = earlier.nonzero(as_tuple=True)
        q_rows[rows, order[cols]] = 0.0
        q_rows /= q_rows.sum(-1, keepdim=True)
        to_target = self.to_target
        full = q_rows.new_zeros(k, self.drafter.fields["vocab_size"])
        full[:, to_target] = q_rows
        first = len(tokens)
        tokens += to_target[order].tolist()
        parents += [parent] * k
        scores += (parent_score + taken.log()).tolist()
        probs += list(full)
        return list(range(first, len(tokens)))

    def _children(self, logps, parent_nodes, tokens, parents, scores, k) -> list[list[int]]:
        """Record the top-k children of each of `parent_nodes` (-1 = the root), whose draft
        log-probabilities are the rows of `logps`, as candidates; their indices, per parent."""
        top = logps.topk(min(k, logps.shape[-1]), dim=-1)
        ids = self.drafter.to_target_ids(top.indices).tolist()
        values = top.values.tolist()
        recorded = []
        for parent, row_ids, row_values in zip(parent_nodes, ids, values, strict=True):
            base = scores[parent] if parent >= 0 else 0.0
            first = len(tokens)
            tokens += row_ids
            parents += [parent] * len(row_ids)
            scores += [base + value for value in row_values]
            recorded.append(list(range(first, len(tokens))))
        return recorded


def load_runtime(folder: Path, record: dict, target, tokenizer, request: DrafterRequest):
    """An EAGLE-1/3 drafter loaded for `target` (the family's `runtime`): chains, or EAGLE-2
    dynamic trees (`TreeSettings`; the defaults when none is given)."""
    tree = request.tree
    if request.published_tree is not None:
        tree = TreeSettings(**request.published_tree)
    if request.proposal == "chain":
        tree = None
    elif tree is None:
        tree = TreeSettings()
    elif not isinstance(tree, TreeSettings):
        raise ProposerError(
            f"an EAGLE drafter drafts EAGLE-2 trees (TreeSettings), not a {type(tree).__name__}"
        )
    adapter = TargetAdapter(target, tokenizer)
    drafter = load_eagle(Path(folder), adapter, dtype=target.dtype, record=record)

    def make() -> Proposer:
        return EagleProposer(drafter, tree, request.cache)

    return LoadedDrafter(drafter, make, tree)
