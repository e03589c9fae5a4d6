"""A causal LM over a preallocated KV cache, with CUDA graphs for the decode-sized forwards.

The dynamic path (`kv_cache.py`) grows and crops a `DynamicCache` with new tensors every round.
Here the keys and values live in buffers allocated once (`max_length` positions plus a scratch
region), so every forward of a given width touches the same memory and can be captured once as
a CUDA graph and replayed:

- a forward writes its `w` tokens at slots `length .. length + w - 1`; their positions are
  `length + depth` (depth = 0..w-1 for a chain, tree depths for a tree); the 4D mask shows each
  query every committed slot and the slots of its own ancestors, so stale entries past
  `length` are never read and rolling a chain back is only a new `length`;
- committing a tree moves the accepted slots down to `length, length + 1, ...` in place.

The only values the host reads are the logits the caller asks for (for greedy acceptance, the
argmax row, which is where the accept length comes from). On CPU the same code runs eagerly.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .errors import GenerationError
from .graphs import use_cuda_graphs
from .kv_cache import cache_kwargs
from .transfer import to_device


class Slots:
    """The write positions every cache layer reads (one tensor per captured width), and how
    many slots attention reads back (None = all: what a captured graph needs; eager forwards
    read only up to their last write, which keeps CPU decoding as cheap as a grown cache)."""

    tensor: torch.Tensor
    limit: int | None = None


@functools.cache
def _slot_layer_class():
    """The slot-writing cache layer class (defined once, on first use: transformers is
    imported lazily)."""
    from transformers.cache_utils import StaticLayer

    class SlotLayer(StaticLayer):
        """A `StaticLayer` that writes at the slots its owner chose, not at a running count."""

        def __init__(self, max_cache_len: int, slots: Slots) -> None:
            super().__init__(max_cache_len=max_cache_len)
            self.slots = slots

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self.keys.index_copy_(2, self.slots.tensor, key_states)
            self.values.index_copy_(2, self.slots.tensor, value_states)
            limit = self.slots.limit
            if limit is None:
                return self.keys, self.values
            return self.keys[:, :, :limit], self.values[:, :, :limit]

    return SlotLayer


def static_cache_of(config, size: int, make_layer):
    """A transformers `StaticCache` of `size` slots whose layers are `make_layer()`'s; models
    with layers other than full attention are refused."""
    from transformers import StaticCache

    cache = StaticCache(config=config, max_cache_len=size)
    if any(type(layer).__name__ != "StaticLayer" for layer in cache.layers):
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        raise GenerationError(
            f"the static cache supports full-attention layers only; this model has {kinds} "
            "(use the dynamic cache)"
        )
    cache.layers = [make_layer() for _ in cache.layers]
    return cache


def slot_cache(config, size: int, slots: Slots):
    """A transformers `StaticCache` whose layers write where `slots` says."""
    layer_class = _slot_layer_class()
    return static_cache_of(config, size, lambda: layer_class(size, slots))


@dataclass
class _Captured:
    """One width's graph and the buffers it reads and writes. The host sets `input_ids`,
    `length` and (for trees) `depths` / `ancestors`; slots, positions and the mask are computed
    inside the graph from them, so a replay costs a few copies."""

    input_ids: torch.Tensor  # [1, w]
    length: torch.Tensor  # [] committed positions
    depths: torch.Tensor  # [w] positions relative to length
    ancestors: torch.Tensor  # [w, w] bool
    chain_layout: bool = True  # depths/ancestors hold the chain's (0..w-1, lower triangle)
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None  # [w, vocab]
    states: dict | None = None  # hooked target states, refreshed by every replay


class StaticForward:
    """Forwards of one causal LM over a preallocated cache; see the module docstring.

    `cuda_graphs`: None = on when the model is on CUDA. Widths up to `max_graph_width` are
    captured on first use and replayed after; wider forwards (prefill) run eagerly.
    """

    def __init__(
        self,
        model,
        max_length: int,
        cuda_graphs: bool | None = None,
        max_graph_width: int = 64,
    ) -> None:
        parameter = next(model.parameters())
        self.model = model.eval()
        self.device, self.dtype = parameter.device, parameter.dtype
        self.use_graphs = use_cuda_graphs(self.device, cuda_graphs)
        self.max_length = max_length
        self.max_graph_width = max_graph_width
        #: slots past max_length: graph warm-ups write there, and a forward's uncommitted nodes
        #: may (nothing committed ever lies there)
        self.size = max_length + max_graph_width
        self._slots = Slots()
        self.cache = slot_cache(model.config, self.size, self._slots)
        self._kwargs = cache_kwargs(model, self.cache)
        self._prefill_kwargs = cache_kwargs(model, self.cache, last_logits_only=True)
        self._chain_layouts: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._offsets = torch.arange(self.size, device=self.device)
        self._graphs: dict[int, _Captured] = {}
        self.length = 0  # committed positions

    def reset(self) -> None:
        """Start a new sequence (the buffers and graphs stay)."""
        self.length = 0

    def nbytes(self) -> int:
        """Bytes of the preallocated keys and values (scratch slots included)."""
        layers = [layer for layer in self.cache.layers if layer.is_initialized]
        return sum(2 * layer.keys.numel() * layer.keys.element_size() for layer in layers)

    def forward(
        self,
        input_ids: torch.Tensor,  # [1, w] on the model's device
        ancestors: torch.Tensor | None = None,  # [w, w] bool: a attends b; None = causal chain
        depths: torch.Tensor | None = None,  # [w] positions relative to `length`; None = 0..w-1
        captured: dict | None = None,  # hooked target states, kept current across replays
        all_logits: bool = True,  # False: the last position's only, eagerly (prefill)
    ) -> torch.Tensor:
        """Logits [w, vocab] of `input_ids` written at slots `length..length+w-1` (valid
        until the next forward)."""
        width = input_ids.shape[1]
        # past max_length only uncommitted nodes may go (a tree near the end of a request)
        if self.length + width > self.size:
            raise GenerationError(
                f"the static cache holds {self.size} slots; this forward needs "
                f"{self.length + width} (raise the cache's max_length)"
            )
        chain = ancestors is None
        if chain:
            ancestors, depths = self._chain_layout(width)
        if not (self.use_graphs and all_logits and width <= self.max_graph_width):
            self._slots.limit = self.length + width
            depths = depths.to(self.device)
            return self._run(input_ids, self.length, depths, ancestors, all_logits)
        entry = self._graphs.get(width) or self._capture(width, captured)
        entry.input_ids.copy_(input_ids)
        entry.length.fill_(self.length)
        if not (chain and entry.chain_layout):
            entry.depths.copy_(depths)
            entry.ancestors.copy_(ancestors)
            entry.chain_layout = chain
        self._slots.limit = None
        self._replay(entry)
        if captured is not None and entry.states:
            captured.update(entry.states)
        return entry.logits

    def commit(self, kept_slots: list[int]) -> None:
        """Keep the forward's slots `kept_slots` (relative, in order) as the next positions."""
        moves = [(self.length + i, self.length + s) for i, s in enumerate(kept_slots) if s != i]
        if moves:
            dst = to_device([d for d, _ in moves], self.device)
            src = to_device([s for _, s in moves], self.device)
            for layer in self.cache.layers:
                layer.keys.index_copy_(2, dst, layer.keys.index_select(2, src))
                layer.values.index_copy_(2, dst, layer.values.index_select(2, src))
        self.length += len(kept_slots)

    def rollback(self, length: int) -> None:
        """Forget every position from `length` on."""
        self.length = min(self.length, length)

    def _chain_layout(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        layout = self._chain_layouts.get(width)
        if layout is None:
            ancestors = torch.ones(width, width, dtype=torch.bool, device=self.device).tril()
            layout = ancestors, torch.arange(width, device=self.device)
            self._chain_layouts[width] = layout
        return layout

    def _run(self, input_ids, length, depths, ancestors, all_logits=True) -> torch.Tensor:
        """The forward a graph captures: slots, positions and mask from `length` (a tensor
        in a graph, an int eagerly, where only `length + w` columns are read)."""
        width = input_ids.shape[1]
        columns = self.size if self._slots.limit is None else self._slots.limit
        self._slots.tensor = self._offsets[:width] + length
        relative = self._offsets[:columns] - length  # [columns]: slot - length
        inside = (relative >= 0) & (relative < width)
        tree = ancestors.to(self.device).gather(
            1, relative.clamp(0, width - 1).expand(width, columns)
        )
        allowed = (relative < 0) | (inside & tree)  # committed, or an ancestor in this forward
        blocked = torch.finfo(self.dtype).min
        mask = torch.full((width, columns), blocked, dtype=self.dtype, device=self.device)
        mask.masked_fill_(allowed, 0)
        out = self.model(
            input_ids=input_ids,
            position_ids=(depths + length)[None],
            attention_mask=mask[None, None],
            **(self._kwargs if all_logits else self._prefill_kwargs),
        )
        return out.logits[0]

    def _replay(self, entry: _Captured) -> None:
        if entry.graph is None:  # buffers without a graph (tests of this path on CPU)
            entry.logits = self._run(entry.input_ids, entry.length, entry.depths, entry.ancestors)
        else:
            entry.graph.replay()

    def _capture(self, width: int, captured: dict | None) -> _Captured:
        """Warm up and capture the width-`width` forward (writes only to scratch slots)."""
        ancestors, depths = self._chain_layout(width)
        entry = _Captured(
            input_ids=torch.zeros(1, width, dtype=torch.long, device=self.device),
            length=torch.tensor(self.max_length, device=self.device),
            depths=depths.clone(),
            ancestors=ancestors.clone(),
        )
        self._slots.limit = None
        self._graphs[width] = entry
        if self.device.type != "cuda":
            return entry
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._run(entry.input_ids, entry.length, entry.depths, entry.ancestors)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        entry.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(entry.graph):  # own pool: no graph reuses another's outputs
            entry.logits = self._run(entry.input_ids, entry.length, entry.depths, entry.ancestors)
        if captured is not None:
            entry.states = dict(captured)
        return entry
