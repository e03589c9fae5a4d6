"""Test proposers: a top-k tree built from a draft model (deterministic), and perturbed drafts."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from draftzoo.inference.proposer import Proposer
from draftzoo.inference.tree import Proposal

#: prompts of the runtime tests: code, an import, a loop, one character
PROMPTS = [
    'def add(a, b):\n    """Return a + b."""\n',
    "import os\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
    "x",
]


class TopKTreeProposer(Proposer):
    """Root children = the draft's top-`width` tokens; each continues greedily (one-hot q)."""

    def __init__(self, model, width: int = 2):
        self.model, self.width = model, width

    @torch.no_grad()
    def propose(self, context, max_tokens, params, generator):
        if max_tokens <= 0:
            return Proposal.chain([])
        logits = self.model(input_ids=torch.tensor([context])).logits[0, -1]
        tokens, parents = [], []
        for first in logits.topk(self.width).indices.tolist():
            sequence, parent = [*context, first], -1
            tokens.append(first)
            parents.append(parent)
            for _ in range(max_tokens - 1):
                parent = len(tokens) - 1
                nxt = int(self.model(input_ids=torch.tensor([sequence])).logits[0, -1].argmax())
                tokens.append(nxt)
                parents.append(parent)
                sequence.append(nxt)
        return Proposal(tokens, parents)


def perturbed_copy(model, scale: float, seed: int = 0):
    """The model with Gaussian noise of `scale` x each weight's std added (a worse draft)."""
    noisy = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in noisy.parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            param.add_((noise * param.float().std() * scale).to(param.dtype))
    return noisy


class RecordingProposer(Proposer):
    """Another proposer, unchanged, with every proposal it made kept as (tokens, parents)."""

    def __init__(self, inner: Proposer) -> None:
        self.inner = inner
        self.target_layers = inner.target_layers
        self.proposals: list[tuple[list[int], list[int]]] = []

    def propose(self, context, max_tokens, params, generator):
        proposal = self.inner.propose(context, max_tokens, params, generator)
        self.proposals.append((list(proposal.tokens), list(proposal.parents)))
        return proposal

    def reset(self) -> None:
        self.inner.reset()

    def observe(self, states) -> None:
        self.inner.observe(states)

    def cache_nbytes(self) -> int:
        return self.inner.cache_nbytes()


#: the tensor methods that hand a value to Python: on a GPU each one waits for the device
HOST_READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__")


@contextmanager
def count_host_reads() -> Iterator[list[int]]:
    """Count the calls of `HOST_READS` in the block (into the yielded one-item list). On CPU
    every tensor is on the host, so this counts what would be device reads on a GPU."""
    import pytest

    count = [0]
    with pytest.MonkeyPatch.context() as patch:
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)

            def counted(self, *args, _original=original, **kwargs):
                count[0] += 1
                return _original(self, *args, **kwargs)

            patch.setattr(torch.Tensor, name, counted)
        yield count


def assert_reads_per_round(generator, prompts, reference, params, extra=lambda metrics: 0):
    """Each prompt decodes to its `reference` tokens with one host read per round (the
    verification's), plus `extra(metrics)` more."""
    for prompt, expected in zip(prompts, reference, strict=True):
        with count_host_reads() as reads:
            out = generator.generate(prompt, params)
        assert out.token_ids == expected
        wanted = out.metrics.num_target_forwards + extra(out.metrics)
        assert reads[0] == wanted, (reads[0], out.metrics.summary())
