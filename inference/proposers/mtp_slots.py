"""MTP modules' caches on slot buffers: growing with the context, or preallocated once with
CUDA graphs for their forwards on a GPU. One code path for both.

Module k's entry for position p lives at slot p of its own cache layer (as in the growing
cache, where layer k holds module k's entries in order). A forward of n entries from position
`first` writes slots `first .. first + n - 1` and each of them sees every slot up to its own:
the slots before `first` hold real entries (or this round's drafts, one position on), and stale
drafts past them are never read, so rolling a module back is only its count of real entries.
Each (module, width) forward is captured once as a CUDA graph and replayed; wider ones (the
prompt's catch-up) run eagerly. On CPU, or on a growing cache, the same code runs eagerly,
reading only the slots written so far (one new entry with no mask, as a grown cache reads it);
a growing cache enlarges its buffers `GROW` slots at a time.
"""

from __future__ import annotations

import copy

import torch

from ...architectures.mtp import MtpDrafter
from ..cache_settings import CacheSettings
from ..errors import GenerationError
from ..graphs import CapturedCall, use_cuda_graphs
from ..slot_cache import RowSlots, grow_slot_cache, slot_cache, static_nbytes


class ModuleSlots:
    """The caches and forwards of an `MtpDrafter`'s modules on slot buffers.

    A static `cache`: `max_length` positions (and `scratch` slots past them for the drafts),
    forwards up to `max_graph_width` entries captured as CUDA graphs on first use when
    `cache.cuda_graphs` says so (None: on CUDA). Otherwise the buffers grow with the context.
    """

    GROW = 256  # slots a growing cache adds at a time

    def __init__(
        self,
        drafter: MtpDrafter,
        cache: CacheSettings,
        max_graph_width: int = 16,
        scratch: int = 16,
    ) -> None:
        self.drafter = drafter.eval()
        weight = drafter.layers[0].eh_proj.weight
        self.device = weight.device
        self.growable = not cache.static
        self.use_graphs = cache.static and use_cuda_graphs(self.device, cache.cuda_graphs)
        self.max_graph_width = max_graph_width
        self.size = cache.max_length + max(scratch, max_graph_width) if cache.static else self.GROW
        config = copy.deepcopy(drafter.block_config)  # one full-attention layer per module
        config.num_hidden_layers = drafter.depth
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = ["full_attention"] * drafter.depth
        self._slots = RowSlots()
        self._slots.rows = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        self.cache = slot_cache(config, self.size, 1, self._slots)
        self._offsets = torch.arange(self.size, device=self.device)
        self._graphs: dict[tuple[int, int], CapturedCall] = {}

    def nbytes(self) -> int:
        """Bytes of the preallocated keys and values (scratch included)."""
        return static_nbytes(self.cache)

    @torch.no_grad()
    def forward(
        self, k: int, ids: torch.Tensor, previous: torch.Tensor, first: int
    ) -> torch.Tensor:
        """Module k over positions `first ..` (tokens `ids` [n], inputs `previous` [n, h]);
        its outputs [n, h] (valid until the next forward of that module and width)."""
        width = ids.shape[0]
        if first + width > self.size:
            self._reserve(first + width)
        if not self.use_graphs or width > self.max_graph_width:
            self._slots.limit = first + width
            return self._run(k, ids, previous, first)
        entry = self._graphs.get((k, width)) or self._capture(k, width, previous)
        entry.inputs["ids"].copy_(ids)
        entry.inputs["previous"].copy_(previous)
        entry.inputs["first"].fill_(first)
        self._slots.limit = None
        (out,) = entry.replay()
        return out

    def _reserve(self, slots: int) -> None:
        """Room for `slots` slots: a growing cache enlarges its buffers, a static one refuses."""
        if not self.growable:
            raise GenerationError(
                f"the MTP drafter's static cache holds {self.size} slots; this forward needs "
                f"{slots} (raise the cache's max_length)"
            )
        self.size = -(-slots // self.GROW) * self.GROW
        grow_slot_cache(self.cache, self.size)
        self._offsets = torch.arange(self.size, device=self.device)

    def _run(self, k, ids, previous, first) -> torch.Tensor:
        """The forward a graph captures (`first` a tensor there, an int eagerly)."""
        width = ids.shape[0]
        slots = self._offsets[:width] + first
        self._slots.tensor = slots[None]
        mask = None  # eagerly, one new entry sees every slot written (as a grown cache reads)
        if width > 1 or self._slots.limit is None:
            columns = self.size if self._slots.limit is None else self._slots.limit
            mask = (self._offsets[:columns][None, :] <= slots[:, None])[None, None]
        positions = (slots + k)[None]
        out = self.drafter.module(k, ids[None], previous[None], positions, mask, self.cache)
        return out[0]

    def _capture(self, k: int, width: int, like: torch.Tensor) -> CapturedCall:
        inputs = {
            "ids": torch.zeros(width, dtype=torch.long, device=self.device),
            "previous": torch.zeros(width, like.shape[-1], dtype=like.dtype, device=self.device),
            "first": torch.tensor(self.size - self.max_graph_width, device=self.device),  # scratch
        }
        self._slots.limit = None
        entry = CapturedCall(
            inputs, lambda: (self._run(k, inputs["ids"], inputs["previous"], inputs["first"]),)
        )
        self._graphs[(k, width)] = entry.capture(self.device)
        return entry
