"""One captured computation: the buffers the host fills, a CUDA graph, the outputs it refreshes.

A drafter's per-round computation (a catch-up, a chain, a tree, the Medusa heads) reads only
preallocated input buffers, so it can be captured once and replayed. Off CUDA an entry keeps no
graph and each replay runs the same function eagerly on the same buffers (what the CPU tests
check).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .errors import GenerationError


def use_cuda_graphs(device: torch.device, asked: bool | None) -> bool:
    """Whether forwards on `device` replay as CUDA graphs: `asked`, or None = on CUDA only;
    asking for them off CUDA is refused."""
    if asked and device.type != "cuda":
        raise GenerationError(f"CUDA graphs need a model on CUDA, not {device.type}")
    return device.type == "cuda" if asked is None else asked


@dataclass
class CapturedCall:
    """`run` over the tensors in `inputs`; `replay` refreshes and returns `outputs`."""

    inputs: dict[str, torch.Tensor]
    run: Callable[[], tuple]
    outputs: tuple = ()
    graph: torch.cuda.CUDAGraph | None = None  # None: replays run eagerly

    def replay(self) -> tuple:
        if self.graph is None:
            self.outputs = self.run()
        else:
            self.graph.replay()
        return self.outputs

    def capture(self, device: torch.device) -> CapturedCall:
        """Warm `run` up on a side stream, then capture it (on CUDA; elsewhere nothing to
        capture). Its inputs must already hold values whose writes are harmless."""
        if device.type != "cuda":
            return self
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.run()
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = self.run()
        return self
