"""EAGLE drafting on slot buffers: the catch-up, the chain and the greedy EAGLE-2 tree, written
once as tensor code, eager on a growing cache and replayed as CUDA graphs on a static one.

The drafter's keys and values live in buffers indexed by slot: a growing cache enlarges them
as the context grows (`GROW` slots at a time), a static one allocates `max_length` real
positions plus scratch for the drafts once. A round is two computations:

- the catch-up: the n new real entries (target states with their next tokens) written at slots
  `length .. length + n - 1`;
- the proposal: a chain of `gamma` draft steps, each writing its token's entry at the next
  scratch slot, or a greedy EAGLE-2 tree (`tree`: each depth's frontier fed in one forward,
  its children scored and the next frontier chosen by a stable sort on the device, the best
  `total_tokens` candidates kept at the end, with the tree's verification layout); the drafts
  stay on the device, so the host reads nothing until the verification reads them with the
  target's answer.

Entry t sits at slot t with position t; a query sees every slot before `length`, and in the
scratch region only the slots of its own ancestors and itself, so stale drafts are never read
and rolling back is only a new `length`. At T > 0 each chain step samples by Gumbel-max from
uniforms drawn with the request's generator before the step, an exact draw from q; sampled
trees draft eagerly on the scratch slots (`growing_view`). Eagerly (CPU, or a growing cache)
attention reads only the slots written so far; on CUDA a static cache captures each catch-up
width up to `max_graph_width`, each chain length and each tree once as a graph and replays it.
"""

from __future__ import annotations

import torch

from ...architectures.eagle import EagleDrafter
from ..cache_settings import CacheSettings
from ..errors import GenerationError
from ..graphs import CapturedCall, use_cuda_graphs
from ..sampling import SamplingParams, gumbel_pick, probabilities
from ..tree import TreeSettings, tree_layout


class SlotDraftCache:
    """`DraftCache`'s interface over buffers indexed by slot: `append` writes at `slots`, and
    `keys`/`values` are the first `columns` slots (None: all of them, what a graph reads).
    A growable cache enlarges its buffers on `reserve`; a static one refuses to."""

    GROW = 256

    def __init__(self, drafter: EagleDrafter, size: int, growable: bool) -> None:
        attention = drafter.midlayer.self_attn
        weight = drafter.fc.weight
        shape = (1, attention.kv_heads, size, attention.head_dim)
        self._keys = torch.zeros(shape, device=weight.device, dtype=weight.dtype)
        self._values = torch.zeros_like(self._keys)
        self.growable = growable
        self.slots = torch.zeros(0, dtype=torch.long, device=weight.device)
        self.columns: int | None = None

    @property
    def size(self) -> int:
        return self._keys.shape[2]

    @property
    def keys(self) -> torch.Tensor:
        return self._keys if self.columns is None else self._keys[:, :, : self.columns]

    @property
    def values(self) -> torch.Tensor:
        return self._values if self.columns is None else self._values[:, :, : self.columns]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self._keys.index_copy_(2, self.slots, k)
        self._values.index_copy_(2, self.slots, v)

    def reserve(self, slots: int) -> bool:
        """Room for `slots` slots: a growable cache enlarges its buffers (True when it did)."""
        if slots <= self.size:
            return False
        if not self.growable:
            raise GenerationError(
                f"the drafter's static cache holds {self.size} slots; this round needs {slots}"
            )
        size = -(-slots // self.GROW) * self.GROW
        grown = self._keys.new_zeros(*self._keys.shape[:2], size, self._keys.shape[3])
        grown_values = torch.zeros_like(grown)
        grown[:, :, : self.size] = self._keys
        grown_values[:, :, : self.size] = self._values
        self._keys, self._values = grown, grown_values
        return True

    def nbytes(self) -> int:
        return 2 * self._keys.numel() * self._keys.element_size()


class GrowingView:
    """`DraftCache`'s growing interface over a `SlotDraftCache`, from `length` on: what the
    eager tree code appends lands in the scratch slots and is forgotten with the view."""

    def __init__(self, cache: SlotDraftCache, length: int) -> None:
        self.cache, self.length = cache, length

    def __len__(self) -> int:
        return self.length

    @property
    def keys(self) -> torch.Tensor:
        return self.cache._keys[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor:
        return self.cache._values[:, :, : self.length]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        end = self.length + k.shape[2]
        self.cache._keys[:, :, self.length : end] = k
        self.cache._values[:, :, self.length : end] = v
        self.length = end

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)


class EagleSlots:
    """An EAGLE drafter's cache, catch-ups, chains and greedy trees on slot buffers; see the
    module docstring.

    `cache`: growing (eager), or static (`max_length` real positions; on CUDA, catch-ups up to
    `max_graph_width` entries, chains up to `max_chain` tokens and trees of `tree`'s size are
    captured as CUDA graphs on first use).
    """

    def __init__(
        self,
        drafter: EagleDrafter,
        cache: CacheSettings,
        tree: TreeSettings | None = None,
        max_graph_width: int = 16,
        max_chain: int = 16,
    ) -> None:
        self.drafter = drafter.eval()
        self.device = drafter.fc.weight.device
        self.use_graphs = cache.static and use_cuda_graphs(self.device, cache.cuda_graphs)
        self.max_length = cache.max_length if cache.static else None
        self.max_graph_width = max_graph_width
        self.max_chain = max_chain if cache.static else None
        #: slots past the real entries that a round's drafts (and graph warm-ups) write
        self.scratch = max(max_graph_width, max_chain)
        if tree is not None:  # a greedy tree's feeds, or a sampled tree's nodes
            self.scratch = max(self.scratch, (tree.depth - 1) * tree.top_k, tree.total_tokens)
        size = cache.max_length + self.scratch if cache.static else SlotDraftCache.GROW
        self.cache = SlotDraftCache(drafter, size, growable=not cache.static)
        self._offsets = torch.arange(self.cache.size, device=self.device)
        draft_ids = torch.arange(drafter.draft_vocab_size, device=self.device)
        self._to_target = drafter.to_target_ids(draft_ids)
        self._vocab = drafter.fields["vocab_size"]
        self._feeds: dict[int, CapturedCall] = {}
        self._chains: dict[tuple, CapturedCall] = {}
        self._trees: dict[tuple, CapturedCall] = {}
        self.length = 0  # real entries

    @property
    def size(self) -> int:
        """Slots allocated now."""
        return self.cache.size

    def _reserve(self, slots: int) -> None:
        """Room for `slots` slots (a growing cache enlarges its buffers)."""
        if self.cache.reserve(slots):
            self._offsets = torch.arange(self.cache.size, device=self.device)

    def reset(self) -> None:
        """Start a new request (buffers and graphs stay)."""
        self.length = 0

    def nbytes(self) -> int:
        """Bytes of the preallocated keys and values (scratch included)."""
        return self.cache.nbytes()

    # -- the catch-up -------------------------------------------------------------------
    @torch.no_grad()
    def feed(self, input_ids: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """Append n real entries (tokens [1, n], target states [1, n, k*h]); the drafter's
        output at the last of them [1, 1, h] (valid until the next call)."""
        width = input_ids.shape[1]
        if self.max_length is not None and self.length + width > self.max_length:
            raise GenerationError(
                f"the drafter's static cache holds {self.max_length} positions; this request "
                f"needs {self.length + width} (raise the cache's max_length)"
            )
        self._reserve(self.length + width + self.scratch)
        if not self.use_graphs or width > self.max_graph_width:
            out = self._feed(input_ids, states, self.length)
        else:
            entry = self._feeds.get(width) or self._capture_feed(width, states)
            entry.inputs["input_ids"].copy_(input_ids)
            entry.inputs["states"].copy_(states)
            entry.inputs["length"].fill_(self.length)
            (out,) = entry.replay()
        self.length += width
        return out

    def _feed(self, input_ids, states, length) -> torch.Tensor:
        return self._extend(input_ids, self.drafter.fuse(states), length)[:, -1:]

    # -- the chain ----------------------------------------------------------------------
    @torch.no_grad()
    def draft(
        self,
        last: torch.Tensor,  # [1, 1, h]: the output at the last real entry
        gamma: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A chain of `gamma` target token ids [gamma] on the device and, at T > 0, the
        distributions q they were drawn from over the target vocabulary [gamma, vocab]."""
        if self.max_chain is not None and not 1 <= gamma <= self.max_chain:
            raise GenerationError(
                f"the static EAGLE drafter drafts chains of 1 to {self.max_chain} tokens, "
                f"not {gamma}"
            )
        self._reserve(self.length + gamma)
        uniforms = None
        if not params.greedy:
            shape = (gamma, self.drafter.draft_vocab_size)
            uniforms = torch.rand(shape, generator=generator, device=self.device)
        if not self.use_graphs:
            return self._chain(last, self.length, gamma, params, uniforms)
        key = (gamma, params.temperature, params.top_k, params.top_p)
        entry = self._chains.get(key) or self._capture_chain(gamma, params, last, uniforms)
        entry.inputs["last"].copy_(last)
        entry.inputs["length"].fill_(self.length)
        if uniforms is not None:
            entry.inputs["uniforms"].copy_(uniforms)
        return entry.replay()

    def _chain(self, last, length, gamma, params, uniforms):
        """The captured chain: every step's token stays a device tensor."""
        drafter = self.drafter
        tokens, qs = [], []
        hidden = last
        for step in range(gamma):
            logits = drafter.logits(hidden)[0, -1].float()
            if uniforms is None:
                draft = logits.argmax(-1, keepdim=True)
            else:
                q = probabilities(logits, params)
                draft = gumbel_pick(q, uniforms[step]).view(1)
                qs.append(q)
            tokens.append(self._to_target.index_select(0, draft))  # [1], no host read
            if step + 1 < gamma:
                hidden = self._extend(tokens[-1].view(1, 1), hidden, length + step)
        if uniforms is None:
            return torch.cat(tokens), None
        probs = torch.zeros(gamma, self._vocab, device=self.device)
        probs.index_copy_(1, self._to_target, torch.stack(qs))
        return torch.cat(tokens), probs

    # -- the greedy EAGLE-2 tree ----------------------------------------------------------
    @torch.no_grad()
    def tree(
        self, last: torch.Tensor, settings: TreeSettings, max_depth: int
    ) -> tuple[torch.Tensor, ...]:
        """A greedy EAGLE-2 tree after the last real entry (output `last` [1, 1, h]): target
        token ids [n], parents [n] (-1 = the root), nodes in creation order, and the tree's
        verification layout (`tree_layout`: depths [n+1], ancestors [n+1, n+1]), on the device.
        The same tree as `EagleProposer`'s eager one: ties go to the earlier candidate."""
        depth = min(settings.depth, max_depth)
        if not self.use_graphs:
            return self._tree(last, self.length, settings, depth)
        key = (depth, settings)
        entry = self._trees.get(key)
        if entry is None:
            inputs = {
                "last": torch.zeros_like(last),
                "length": torch.tensor(self.max_length, device=self.device),
            }
            entry = CapturedCall(
                inputs, lambda: self._tree(inputs["last"], inputs["length"], settings, depth)
            )
            entry.capture(self.device)
            self._trees[key] = entry
        entry.inputs["last"].copy_(last)
        entry.inputs["length"].fill_(self.length)
        return entry.replay()

    def _tree(self, last, length, settings: TreeSettings, depth: int):
        """The captured tree: its tokens, parents and layout as device tensors."""
        drafter, k = self.drafter, min(settings.top_k, self.drafter.draft_vocab_size)
        logp = torch.log_softmax(drafter.logits(last)[0, -1].float(), dim=-1)
        top = logp.topk(k)
        # cumulative log-probabilities in float64, as the eager tree sums them in Python
        tokens, scores = [top.indices], [top.values.double()]
        parents = [torch.full((k,), -1, dtype=torch.long, device=self.device)]
        frontier = torch.arange(k, device=self.device)  # candidate indices
        frontier_tokens, frontier_scores = top.indices, scores[0]
        hidden = last[0, 0].expand(k, -1)  # each frontier node's parent output
        scratch = max(0, (depth - 1) * k)
        ancestors = torch.zeros(k, scratch, dtype=torch.bool, device=self.device)
        columns = torch.arange(scratch, device=self.device)
        for d in range(2, depth + 1):
            first = (d - 2) * k  # this feed's first scratch slot, relative to `length`
            out = self._feed_frontier(frontier_tokens, hidden, ancestors, length, first, d)
            logps = torch.log_softmax(drafter.logits(out)[0].float(), dim=-1)
            top = logps.topk(k)  # [k, k]: each frontier node's k children
            child_scores = (frontier_scores[:, None] + top.values.double()).reshape(-1)
            order = torch.sort(child_scores, descending=True, stable=True).indices[:k]
            parent_rows = order // k
            tokens.append(top.indices.reshape(-1))
            scores.append(child_scores)
            parents.append(frontier[:, None].expand(k, k).reshape(-1))
            frontier = k + (d - 2) * k * k + order
            frontier_tokens = tokens[-1].index_select(0, order)
            frontier_scores = child_scores.index_select(0, order)
            hidden = out[0].index_select(0, parent_rows)
            # the parent's own scratch slot (a comparison: writing a host `True` into a device
            # tensor would copy from the host, which a CUDA graph cannot capture)
            slot = columns[None, :] == (first + parent_rows)[:, None]
            ancestors = ancestors.index_select(0, parent_rows) | slot
        all_tokens, all_scores = torch.cat(tokens), torch.cat(scores)
        all_parents = torch.cat(parents)
        best = torch.sort(all_scores, descending=True, stable=True).indices
        keep = best[: settings.total_tokens].sort().values  # creation order: parents first
        position = torch.full_like(all_parents, -1)
        position[keep] = torch.arange(len(keep), device=self.device)
        kept_parents = all_parents.index_select(0, keep)
        remapped = position.index_select(0, kept_parents.clamp_min(0))
        tree_parents = torch.where(kept_parents >= 0, remapped, kept_parents)
        tokens = self._to_target.index_select(0, all_tokens.index_select(0, keep))
        return tokens, tree_parents, *tree_layout(tree_parents, depth)

    def _feed_frontier(self, draft_ids, hidden, ancestors, length, first, d) -> torch.Tensor:
        """One drafter forward over the frontier (draft ids [k], parent outputs [k, h]) at
        scratch slots `length + first ..`: each node sees the real entries, its ancestors'
        slots and its own. Outputs [1, k, h]."""
        width, scratch = draft_ids.shape[0], ancestors.shape[1]
        eager = isinstance(length, int)
        columns = length + first + width if eager else self.size
        slots = self._offsets[:width] + length + first
        relative = self._offsets[:columns] - length  # [columns]: slot - length
        inside = (relative >= 0) & (relative < scratch)
        seen = ancestors.gather(1, relative.clamp(0, max(scratch - 1, 0)).expand(width, -1))
        seen = (seen & inside) if scratch else torch.zeros_like(inside).expand(width, -1)
        mask = (relative < 0) | seen | (self._offsets[:columns] == slots[:, None])
        self.cache.slots = slots
        self.cache.columns = columns if eager else None
        ids = self._to_target.index_select(0, draft_ids)[None]
        positions = (length + d - 2) + torch.zeros_like(ids)
        return self.drafter.extend(ids, hidden[None], positions, self.cache, mask[None, None])

    def growing_view(self) -> GrowingView:
        """The scratch slots from `length` on as a growing cache (sampled trees)."""
        return GrowingView(self.cache, self.length)

    # -- the shared forward ---------------------------------------------------------------
    def _extend(self, input_ids, g, length) -> torch.Tensor:
        """Entries for tokens [1, w] and features g [1, w, h] at slots `length ..` (an int
        eagerly, a tensor in a graph); the outputs [1, w, h]."""
        width = input_ids.shape[1]
        slots = self._offsets[:width] + length
        eager = isinstance(length, int)
        columns = length + width if eager else self.size
        self.cache.slots = slots
        self.cache.columns = columns if eager else None
        mask = None  # eagerly one entry reads exactly the slots written: all of them
        if width > 1 or not eager:
            relative = self._offsets[:columns] - length  # [columns]: slot - length
            mask = (relative[None, :] <= self._offsets[:width, None])[None, None]
        return self.drafter.extend(input_ids, g, slots[None], self.cache, mask)

    # -- capture ------------------------------------------------------------------------
    def _capture_feed(self, width: int, like: torch.Tensor) -> CapturedCall:
        inputs = {
            "input_ids": torch.zeros(1, width, dtype=torch.long, device=self.device),
            "states": torch.zeros(1, width, like.shape[-1], dtype=like.dtype, device=self.device),
            "length": torch.tensor(self.max_length, device=self.device),
        }
        entry = CapturedCall(
            inputs, lambda: (self._feed(inputs["input_ids"], inputs["states"], inputs["length"]),)
        )
        entry.capture(self.device)
        self._feeds[width] = entry
        return entry

    def _capture_chain(self, gamma, params, like, uniforms) -> CapturedCall:
        inputs = {
            "last": torch.zeros_like(like),
            "length": torch.tensor(self.max_length, device=self.device),
        }
        if uniforms is not None:
            inputs["uniforms"] = torch.rand_like(uniforms)
        entry = CapturedCall(
            inputs,
            lambda: self._chain(
                inputs["last"], inputs["length"], gamma, params, inputs.get("uniforms")
            ),
        )
        entry.capture(self.device)
        self._chains[(gamma, params.temperature, params.top_k, params.top_p)] = entry
        return entry
