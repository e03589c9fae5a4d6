"""MTP modules' caches on preallocated buffers, with CUDA graphs for their forwards on a GPU.

Module k's entry for position p lives at slot p of its own cache layer (as in the growing
cache, where layer k holds module k's entries in order). A forward of n entries from position
`first` writes slots `first .. first + n - 1` and each of them sees every slot up to its own:
the slots before `first` hold real entries (or this round's drafts, one position on), and stale
drafts past them are never read, so rolling a module back is only its count of real entries.
Each (module, width) forward is captured once as a CUDA graph and replayed; wider ones (the
prompt's catch-up) run eagerly. On CPU the same code runs eagerly, reading only the slots
written so far.
"""

from __future__ import annotations

import copy

import torch

from ..architectures.mtp import MtpDrafter
from .errors import GenerationError
from .graphs import CapturedCall, use_cuda_graphs
from .slot_cache import RowSlots, slot_cache, static_nbytes


class StaticModules:
    """The caches and forwards of an `MtpDrafter`'s modules on static buffers.

    `cuda_graphs`: None = on when the drafter is on CUDA. Forwards up to `max_graph_width`
    entries are captured on first use; `scratch` slots past `max_length` take the drafts.
    """

    def __init__(
        self,
        drafter: MtpDrafter,
        max_length: int,
        cuda_graphs: bool | None = None,
        max_graph_width: int = 16,
        scratch: int = 16,
    ) -> None:
        self.drafter = drafter.eval()
        weight = drafter.layers[0].eh_proj.weight
        self.device = weight.device
        self.use_graphs = use_cuda_graphs(self.device, cuda_graphs)
        self.max_length, self.max_graph_width = max_length, max_graph_width
        self.size = max_length + max(scratch, max_graph_width)
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
            raise GenerationError(
                f"the MTP drafter's static cache holds {self.size} slots; this forward needs "
                f"{first + width} (raise the cache's max_length)"
            )
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

    def _run(self, k, ids, previous, first) -> torch.Tensor:
        """The forward a graph captures (`first` a tensor there, an int eagerly)."""
        width = ids.shape[0]
        slots = self._offsets[:width] + first
        self._slots.tensor = slots[None]
        columns = self.size if self._slots.limit is None else self._slots.limit
        mask = self._offsets[:columns][None, :] <= slots[:, None]  # every slot up to its own
        positions = (slots + k)[None]
        out = self.drafter.module(
            k, ids[None], previous[None], positions, mask[None, None], self.cache
        )
        return out[0]

    def _capture(self, k: int, width: int, like: torch.Tensor) -> CapturedCall:
        inputs = {
            "ids": torch.zeros(width, dtype=torch.long, device=self.device),
            "previous": torch.zeros(width, like.shape[-1], dtype=like.dtype, device=self.device),
            "first": torch.tensor(self.max_length, device=self.device),  # scratch until replayed
        }
        self._slots.limit = None
        entry = CapturedCall(
            inputs, lambda: (self._run(k, inputs["ids"], inputs["previous"], inputs["first"]),)
        )
        self._graphs[(k, width)] = entry.capture(self.device)
        return entry
