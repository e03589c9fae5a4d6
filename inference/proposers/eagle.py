"""EAGLE proposers: chain drafting and EAGLE-2 dynamic trees over the drafter's own cache.

The generate loops hand the proposer the target's states at the drafter's layers for every
committed position (`observe`): the prefill's, then after each verification the root's and the
accepted nodes'. `propose` first feeds the pending (state, next token) pairs into the drafter's
cache — these entries are real and stay — then drafts on top of them in scratch slots that
the next round overwrites, so it starts from real entries only (`eagle_slots.py`).

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

from pathlib import Path

import torch

from ...architectures.eagle import EagleDrafter, load_eagle
from ...architectures.target import TargetAdapter
from ..cache_settings import GROWING, CacheSettings
from ..drafter_request import DrafterRequest, LoadedDrafter
from ..proposer import Proposer
from ..sampling import SamplingParams, is_distribution, probabilities
from ..transfer import to_device
from ..tree import Proposal, TreeSettings
from .eagle_slots import EagleSlots


class EagleProposer(Proposer):
    """Drafts with an EAGLE-1/3 drafter; a chain, or an EAGLE-2 tree when `tree` is given.

    The catch-up, the chain and the greedy tree run as tensor code on slot buffers
    (`eagle_slots.py`): growing with the context, or with a static `cache` preallocated for its
    `max_length` positions and replayed as CUDA graphs on CUDA. Sampled trees draft eagerly on
    the scratch slots."""

    def __init__(
        self,
        drafter: EagleDrafter,
        tree: TreeSettings | None = None,
        cache: CacheSettings = GROWING,
    ) -> None:
        self.drafter = drafter.eval()
        self.tree = tree
        self.slots = EagleSlots(drafter, cache, tree=tree)
        self.target_layers = tuple(drafter.layers)
        self.device = drafter.fc.weight.device
        self.dtype = drafter.fc.weight.dtype
        #: the target id of every draft id
        self.to_target = drafter.to_target_ids(
            torch.arange(drafter.draft_vocab_size, device=self.device)
        )
        self.reset()

    @classmethod
    def from_pretrained(
        cls, path: str | Path, target, tokenizer=None, tree: TreeSettings | None = None
    ) -> EagleProposer:
        """Load a drafter folder for `target` (a transformers causal LM), checked against it."""
        adapter = TargetAdapter(target, tokenizer)
        return cls(load_eagle(Path(path), adapter, dtype=target.dtype), tree)

    def reset(self) -> None:
        """Forget the request: no real entries, no pending states."""
        self.pending: list[torch.Tensor] = []  # [n, k*h] target states not yet fed
        self.slots.reset()

    def cache_nbytes(self) -> int:
        """Bytes held by the drafter's KV cache."""
        return self.slots.nbytes()

    def observe(self, states: torch.Tensor) -> None:
        """Target states [n, k*h] of the next n committed positions."""
        if len(states):
            self.pending.append(states.to(self.device, self.dtype))

    def _catch_up(self, context: list[int]) -> torch.Tensor | None:
        """Feed pending states with their next tokens; the last real output [1, 1, h]
        (None for a one-token prompt, which has no state to draft from yet)."""
        if not self.pending:
            if len(context) == 1:
                return None
            raise RuntimeError("EagleProposer.propose called with no new target states")
        states = torch.cat(self.pending)[None]
        self.pending = []
        n, fed = states.shape[1], self.slots.length
        if fed + n != len(context) - 1:
            raise RuntimeError(
                f"target states cover {fed + n} positions, the context has {len(context)} "
                "tokens; every committed position but the last needs its state"
            )
        return self.slots.feed(to_device([context[fed + 1 : fed + n + 1]], self.device), states)

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
        if self.tree is None:
            tokens, draft_probs = self.slots.draft(last, max_tokens, params, generator)
            return Proposal.chain(tokens, draft_probs)  # read with the verification
        if params.greedy:
            tokens, parents, depths, ancestors = self.slots.tree(last, self.tree, max_tokens)
            return Proposal(tokens, parents, layout=(depths, ancestors))  # read when verified
        return self._sampled_tree(last, max_tokens, params, generator)

    # -- sampled trees, eagerly on the scratch slots ----------------------------------------
    def _feed(self, view, nodes, tokens, parents, hidden_of, slot_of, depth) -> torch.Tensor:
        """One drafter forward over tree `nodes` (all at `depth`) appended to the scratch
        `view`: each sees the real entries, its fed ancestors and itself. Returns their outputs
        [1, len(nodes), h]."""
        base, fed = len(view), self.slots.length
        ids = torch.tensor([[tokens[c] for c in nodes]], device=self.device)
        g = torch.stack([hidden_of[c] for c in nodes])[None]
        positions = torch.full_like(ids, fed + depth - 1)
        mask = torch.zeros(1, 1, len(nodes), base + len(nodes), dtype=torch.bool)
        mask[..., :fed] = True
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
        return self.drafter.extend(ids, g, positions, view, mask.to(self.device))

    def _sampled_tree(self, root_hidden, max_depth, params, generator) -> Proposal:
        drafter, settings = self.drafter, self.tree
        view = self.slots.growing_view()  # forgotten with the round: the real entries stay
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
            out = self._feed(view, expand, tokens, parents, hidden_of, slot_of, depth - 1)
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
        return Proposal(tokens, parents, torch.stack(probs) if probs else None)

    def _sample_children(
        self, q, parent, parent_score, k, generator, tokens, parents, scores, probs
    ) -> list[int]:
        """Draw up to k children of `parent` from q (draft vocabulary) without replacement;
        child i records q_i (q without the earlier siblings, renormalised) over the target
        vocabulary.

        One Gumbel-top-k draw: the order of the k largest log q + Gumbel keys is distributed as
        k sequential draws without replacement (Kool et al., 2019)."""
        k = min(k, int((q > 0).sum())) if bool(is_distribution(q)) else 0  # NaN: no children
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


def load_runtime(folder: Path, record: dict, target, tokenizer, request: DrafterRequest):
    """An EAGLE-1/3 drafter loaded for `target` (the family's `runtime`): chains, or EAGLE-2
    dynamic trees (`TreeSettings`; the defaults when none is given)."""
    tree = request.tree_or(TreeSettings())
    adapter = TargetAdapter(target, tokenizer)
    drafter = load_eagle(Path(folder), adapter, target.dtype, record, request.files)

    def make() -> Proposer:
        return EagleProposer(drafter, tree, request.cache)

    return LoadedDrafter(drafter, make, tree)
