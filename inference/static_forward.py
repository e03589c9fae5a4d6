"""Forwards of one causal LM over a preallocated cache, each row at its own length.

Batch-1 decoding is the one-row case of batched decoding. Row r's keys and values live in row
r of buffers [rows, heads, slots, dim] allocated once (`slot_cache.py`). A forward of R rows
and width w writes row r's tokens at slots `lengths[r] .. lengths[r] + w - 1` (positions
`lengths[r] + depth`), and row r's queries see its own committed slots and its own ancestors
in the forward; rows with fewer tokens are padded with queries nobody sees. Committing moves
each row's accepted slots down in place; finished rows are dropped by moving the rows kept up,
so the live rows are always 0..R-1. Each (rows, width) forward up to `max_graph_width` wide is
captured once as a CUDA graph on CUDA and replayed after; on CPU the same code runs eagerly.
`GrowingForward` (`growing_forward.py`) is the same interface over a cache that grows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..architectures.attention_masks import layer_masks
from .cpu_kernels import CpuKernels, verifying
from .errors import GenerationError
from .graphs import CapturedCall, use_cuda_graphs
from .kv_cache import cache_kwargs
from .slot_cache import RowSlots, slot_cache, static_nbytes
from .transfer import to_device


@dataclass
class _Shape:
    """One (rows, width) forward's input buffers and its captured call."""

    input_ids: torch.Tensor  # [R, w]
    lengths: torch.Tensor  # [R]
    depths: torch.Tensor  # [R, w]
    ancestors: torch.Tensor  # [R, w, w] bool
    chain_layout: bool = True  # depths/ancestors hold chains' (0..w-1, lower triangles)
    call: CapturedCall | None = None
    states: dict | None = None  # hooked target states, refreshed by every replay


class StaticForward:
    """Forwards of `model` over a preallocated cache; see the module docstring."""

    def __init__(
        self,
        model,
        max_length: int,
        max_rows: int = 1,
        cuda_graphs: bool | None = None,
        max_graph_width: int = 64,
        kernels: CpuKernels | None = None,
    ) -> None:
        """`kernels`: the CPU kernels its eager verification forwards run on (None: the
        stock)."""
        parameter = next(model.parameters())
        self.model = model.eval()
        self.kernels = kernels
        self.device, self.dtype = parameter.device, parameter.dtype
        self.use_graphs = use_cuda_graphs(self.device, cuda_graphs)
        self.max_length, self.max_rows = max_length, max_rows
        self.max_graph_width = max_graph_width
        #: slots past max_length: uncommitted nodes and padding may be written there
        self.size = max_length + max_graph_width
        self._slots = RowSlots()
        self.cache = slot_cache(model.config, self.size, max_rows, self._slots)
        self._kwargs = cache_kwargs(model, self.cache)
        self._prefill_kwargs = cache_kwargs(model, self.cache, last_logits_only=True)
        self._offsets = torch.arange(self.size, device=self.device)
        self._row_index = torch.arange(max_rows, device=self.device)[:, None]
        self._shapes: dict[tuple[int, int], _Shape] = {}
        self._chains: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.lengths: list[int] = []  # committed positions of each live row

    def reset(self, rows: int) -> None:
        """Start `rows` new sequences (the buffers and graphs stay)."""
        if rows > self.max_rows:
            raise GenerationError(f"{rows} rows do not fit a static batch of {self.max_rows}")
        self.lengths = [0] * rows

    def nbytes(self) -> int:
        """Bytes of the preallocated keys and values (every row and scratch slot)."""
        return static_nbytes(self.cache)

    def forward(
        self,
        input_ids: torch.Tensor,  # [R, w] on the model's device, R = the live rows
        depths: torch.Tensor | None,  # [R, w] positions relative to each row's length
        ancestors: torch.Tensor | None,  # [R, w, w] bool: in row r, a attends b; None: chains
        captured: dict | None = None,  # hooked target states, kept current across replays
        all_logits: bool = True,  # False: the last position's only, eagerly (prefill)
    ) -> torch.Tensor:
        """Logits [R, w, vocab] (valid until the next forward)."""
        rows, width = input_ids.shape
        chain = ancestors is None
        if chain:
            depths, ancestors = self._chain_layout(rows, width)
        if rows != len(self.lengths):
            raise GenerationError(f"{rows} input rows for {len(self.lengths)} live rows")
        if max(self.lengths) + width > self.size:
            raise GenerationError(
                f"the static cache holds {self.size} slots; this forward needs "
                f"{max(self.lengths) + width} (raise the cache's max_length)"
            )
        lengths = to_device(self.lengths, self.device)
        depths, ancestors = to_device(depths, self.device), to_device(ancestors, self.device)
        if not (self.use_graphs and all_logits and width <= self.max_graph_width):
            self._slots.limit = max(self.lengths) + width
            with verifying(self.kernels, width, all_logits):
                return self._run(input_ids, lengths, depths, ancestors, all_logits)
        shape = self._shapes.get((rows, width)) or self._capture(rows, width, captured)
        shape.input_ids.copy_(input_ids)
        shape.lengths.copy_(lengths)
        if not (chain and shape.chain_layout):  # a chain's layout is already in place
            shape.depths.copy_(depths)
            shape.ancestors.copy_(ancestors)
            shape.chain_layout = chain
        self._slots.limit = None
        (logits,) = shape.call.replay()
        if captured is not None and shape.states:
            captured.update(shape.states)
        return logits

    def commit(self, kept: list[list[int]]) -> None:
        """Keep, in row r, the forward's slots `kept[r]` (relative, in order) as its next
        positions."""
        moves = [
            (row, self.lengths[row] + i, self.lengths[row] + s)
            for row, slots in enumerate(kept)
            for i, s in enumerate(slots)
            if s != i
        ]
        if moves:
            rows, dst, src = (to_device(list(c), self.device) for c in zip(*moves, strict=True))
            for layer in self.cache.layers:
                layer.keys[rows, :, dst] = layer.keys[rows, :, src]
                layer.values[rows, :, dst] = layer.values[rows, :, src]
        self.lengths = [length + len(s) for length, s in zip(self.lengths, kept, strict=True)]

    def rollback(self, lengths: list[int]) -> None:
        """Forget, in row r, every position from `lengths[r]` on."""
        self.lengths = [min(old, new) for old, new in zip(self.lengths, lengths, strict=True)]

    def keep_rows(self, rows: list[int]) -> None:
        """Keep the live rows `rows` (in that order) as rows 0..len(rows) - 1."""
        if rows != list(range(len(rows))):
            index = to_device(rows, self.device)
            for layer in self.cache.layers:
                layer.keys[: len(rows)] = layer.keys[index]
                layer.values[: len(rows)] = layer.values[index]
        self.lengths = [self.lengths[r] for r in rows]

    def repeat(self, rows: int) -> None:
        """Row 0 copied into `rows` rows (one prompt prefilled once for several requests)."""
        length = self.lengths[0]
        self.reset(rows)  # checks the size
        for layer in self.cache.layers:
            layer.keys[1:rows] = layer.keys[:1]
            layer.values[1:rows] = layer.values[:1]
        self.lengths = [length] * rows

    def _chain_layout(self, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Depths [R, w] and ancestors [R, w, w] of a chain in every row (made once)."""
        layout = self._chains.get((rows, width))
        if layout is None:
            chain = torch.ones(width, width, dtype=torch.bool, device=self.device).tril()
            depths = torch.arange(width, device=self.device).repeat(rows, 1)
            layout = self._chains[(rows, width)] = depths, chain.repeat(rows, 1, 1)
        return layout

    def _run(self, input_ids, lengths, depths, ancestors, all_logits=True) -> torch.Tensor:
        """The forward a graph captures: slots, positions and mask from `lengths` [R]."""
        rows, width = input_ids.shape
        columns = self.size if self._slots.limit is None else self._slots.limit
        lengths = lengths[:, None]
        self._slots.rows = self._row_index[:rows]
        self._slots.tensor = self._offsets[:width] + lengths  # [R, w]
        relative = self._offsets[:columns] - lengths  # [R, columns]: slot - length
        inside = (relative >= 0) & (relative < width)
        index = relative.clamp(0, width - 1)[:, None, :].expand(rows, width, columns)
        tree = ancestors.gather(2, index)  # [R, w, columns]
        allowed = (relative < 0)[:, None] | (inside[:, None] & tree)
        positions = depths + lengths
        # a committed slot's position is its slot; a new one's, its row's length + its depth
        new_positions = positions.gather(1, index[:, 0])
        key_positions = torch.where(relative < 0, self._offsets[:columns], new_positions)
        mask = layer_masks(self.model.config, allowed, positions, key_positions, self.dtype)
        out = self.model(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=mask,
            **(self._kwargs if all_logits else self._prefill_kwargs),
        )
        return out.logits

    def _capture(self, rows: int, width: int, captured: dict | None) -> _Shape:
        """Capture the (rows, width) forward; its warm-up writes only at scratch slots."""
        depths, ancestors = self._chain_layout(rows, width)
        shape = _Shape(
            input_ids=torch.zeros(rows, width, dtype=torch.long, device=self.device),
            lengths=torch.full((rows,), self.max_length, device=self.device),
            depths=depths.clone(),
            ancestors=ancestors.clone(),
        )
        self._slots.limit = None

        def run() -> tuple:
            return (self._run(shape.input_ids, shape.lengths, shape.depths, shape.ancestors),)

        shape.call = CapturedCall({}, run).capture(self.device)
        if captured is not None and self.device.type == "cuda":
            shape.states = dict(captured)
        self._shapes[(rows, width)] = shape
        return shape
