"""EAGLE chain drafting over a preallocated drafter cache, with CUDA graphs on a GPU.

The eager proposer (`eagle.py`) grows its `DraftCache` and reads every drafted token back to
the host before drafting the next. Here the drafter's keys and values live in buffers allocated
once (`max_length` real positions plus scratch for the drafts), and a round is two fixed-shape
computations, each captured once as a CUDA graph and replayed:

- the catch-up: the n new real entries (target states with their next tokens) written at slots
  `length .. length + n - 1`, one graph per width n (wider ones, the prompt, run eagerly);
- the chain: `gamma` draft steps, each writing its token's entry at the next scratch slot; the
  draft tokens stay on the device, so the host reads nothing until the proposal is complete.

Entry t sits at slot t with position t, as in the growing cache; a query sees every slot before
its own forward's first slot and the slots of its own forward up to itself, so stale drafts
past `length` are never read and rolling back is only a new `length`. At T > 0 each draft step
samples by Gumbel-max from uniforms drawn with the request's generator before the replay, an
exact draw from q. On CPU the same code runs eagerly (reading only the committed columns).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..architectures.eagle import EagleDrafter
from .errors import GenerationError
from .sampling import SamplingParams, probabilities


class SlotDraftCache:
    """`DraftCache`'s interface over buffers allocated once: `append` writes at `slots`, and
    `keys`/`values` are the first `columns` slots (None: all of them, what a graph reads)."""

    def __init__(self, drafter: EagleDrafter, size: int) -> None:
        attention = drafter.midlayer.self_attn
        weight = drafter.fc.weight
        shape = (1, attention.kv_heads, size, attention.head_dim)
        self._keys = torch.zeros(shape, device=weight.device, dtype=weight.dtype)
        self._values = torch.zeros_like(self._keys)
        self.slots = torch.zeros(0, dtype=torch.long, device=weight.device)
        self.columns: int | None = None

    @property
    def keys(self) -> torch.Tensor:
        return self._keys if self.columns is None else self._keys[:, :, : self.columns]

    @property
    def values(self) -> torch.Tensor:
        return self._values if self.columns is None else self._values[:, :, : self.columns]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self._keys.index_copy_(2, self.slots, k)
        self._values.index_copy_(2, self.slots, v)

    def nbytes(self) -> int:
        return 2 * self._keys.numel() * self._keys.element_size()


@dataclass
class _Graph:
    """One captured computation: the buffers the host fills, the outputs a replay refreshes."""

    inputs: dict[str, torch.Tensor]
    run: Callable[[], tuple]  # what the graph captured, on the input buffers
    outputs: tuple = ()
    graph: torch.cuda.CUDAGraph | None = None  # None: replays run eagerly (tests, off CUDA)

    def replay(self) -> tuple:
        if self.graph is None:
            self.outputs = self.run()
        else:
            self.graph.replay()
        return self.outputs


class StaticEagleChain:
    """An EAGLE drafter's cache and chain drafting on static buffers; see the module docstring.

    `cuda_graphs`: None = on when the drafter is on CUDA. Catch-ups up to `max_graph_width`
    entries and chains up to `max_chain` tokens are captured on first use.
    """

    def __init__(
        self,
        drafter: EagleDrafter,
        max_length: int,
        cuda_graphs: bool | None = None,
        max_graph_width: int = 16,
        max_chain: int = 16,
    ) -> None:
        self.drafter = drafter.eval()
        self.device = drafter.fc.weight.device
        if cuda_graphs and self.device.type != "cuda":
            raise GenerationError(f"CUDA graphs need a drafter on CUDA, not {self.device.type}")
        self.use_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.max_length = max_length
        self.max_graph_width = max_graph_width
        self.max_chain = max_chain
        #: slots past max_length: graph warm-ups and drafts write there, nothing real does
        self.size = max_length + max(max_graph_width, max_chain)
        self.cache = SlotDraftCache(drafter, self.size)
        self._offsets = torch.arange(self.size, device=self.device)
        draft_ids = torch.arange(drafter.draft_vocab_size, device=self.device)
        self._to_target = drafter.to_target_ids(draft_ids)
        self._vocab = drafter.fields["vocab_size"]
        self._feeds: dict[int, _Graph] = {}
        self._chains: dict[tuple, _Graph] = {}
        self.length = 0  # real entries

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
        if self.length + width > self.max_length:
            raise GenerationError(
                f"the drafter's static cache holds {self.max_length} positions; this request "
                f"needs {self.length + width} (raise max_cache_length)"
            )
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
        if not 1 <= gamma <= self.max_chain:
            raise GenerationError(
                f"the static EAGLE drafter drafts chains of 1 to {self.max_chain} tokens, "
                f"not {gamma}"
            )
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
                gumbel = -(-uniforms[step].clamp_min(1e-20).log()).log()
                draft = (q.log() + gumbel).argmax(-1, keepdim=True)
                qs.append(q)
            tokens.append(self._to_target.index_select(0, draft))  # [1], no host read
            if step + 1 < gamma:
                hidden = self._extend(tokens[-1].view(1, 1), hidden, length + step)
        if uniforms is None:
            return torch.cat(tokens), None
        probs = torch.zeros(gamma, self._vocab, device=self.device)
        probs.index_copy_(1, self._to_target, torch.stack(qs))
        return torch.cat(tokens), probs

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
        relative = self._offsets[:columns] - length  # [columns]: slot - length
        mask = relative[None, :] <= self._offsets[:width, None]  # committed, or up to itself
        return self.drafter.extend(input_ids, g, slots[None], self.cache, mask[None, None])

    # -- capture ------------------------------------------------------------------------
    def _capture_feed(self, width: int, like: torch.Tensor) -> _Graph:
        inputs = {
            "input_ids": torch.zeros(1, width, dtype=torch.long, device=self.device),
            "states": torch.zeros(1, width, like.shape[-1], dtype=like.dtype, device=self.device),
            "length": torch.tensor(self.max_length, device=self.device),
        }
        entry = _Graph(
            inputs, lambda: (self._feed(inputs["input_ids"], inputs["states"], inputs["length"]),)
        )
        self._capture(entry)
        self._feeds[width] = entry
        return entry

    def _capture_chain(self, gamma, params, like, uniforms) -> _Graph:
        inputs = {
            "last": torch.zeros_like(like),
            "length": torch.tensor(self.max_length, device=self.device),
        }
        if uniforms is not None:
            inputs["uniforms"] = torch.rand_like(uniforms)
        entry = _Graph(
            inputs,
            lambda: self._chain(
                inputs["last"], inputs["length"], gamma, params, inputs.get("uniforms")
            ),
        )
        self._capture(entry)
        self._chains[(gamma, params.temperature, params.top_k, params.top_p)] = entry
        return entry

    def _capture(self, entry: _Graph) -> None:
        """Warm `entry.run` up on a side stream, then capture it (it writes only scratch
        slots: its `length` input holds max_length until the first replay). Off CUDA the
        entry keeps no graph and its replays run eagerly on the same buffers."""
        if self.device.type != "cuda":
            return
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                entry.run()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        entry.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(entry.graph):
            entry.outputs = entry.run()
