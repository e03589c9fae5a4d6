"""The bigram drafter's proposer and the family's loader."""

from __future__ import annotations

from pathlib import Path

import torch

from draftzoo.architectures.target import TargetAdapter
from draftzoo.inference.drafter_request import DrafterRequest, LoadedDrafter
from draftzoo.inference.proposer import Proposer
from draftzoo.inference.sampling import probabilities, sample
from draftzoo.inference.tree import Proposal

from .architecture import BigramDrafter, load_bigram


class BigramProposer(Proposer):
    """Drafts a chain one token at a time from the last token."""

    def __init__(self, drafter: BigramDrafter) -> None:
        self.drafter = drafter

    @torch.no_grad()
    def propose(self, context, max_tokens, params, generator) -> Proposal:
        token, tokens, probs = context[-1], [], []
        device = self.drafter.head.weight.device
        for _ in range(max_tokens):
            logits = self.drafter(torch.tensor(token, device=device))
            q = probabilities(logits, params)
            token = int(q.argmax()) if params.greedy else sample(q, generator)
            tokens.append(token)
            probs.append(q)
        return Proposal.chain(tokens, torch.stack(probs) if probs else None)


def load_runtime(folder: Path, record: dict, target, tokenizer, request: DrafterRequest):
    drafter = load_bigram(folder, TargetAdapter(target, tokenizer), target.dtype, record)
    return LoadedDrafter(drafter, lambda: BigramProposer(drafter))
