"""Test proposers: a top-k tree built from a draft model (deterministic), and perturbed drafts."""

from __future__ import annotations

import copy

import torch

from draftzoo.inference.proposers import Proposer
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
