"""The target's head as a drafter drafts with it: whole, or over a draft vocabulary.

EAGLE-1, MTP and DFlash project onto the target's own output head, never saved with them. A
drafter of theirs with a draft vocabulary keeps only the map, as EAGLE-3 does (`d2t`
[draft vocab] int64 with target id = draft id + d2t[draft id], draft ids following ascending
target ids; `t2d` [vocab] bool marking the kept ids: speculators' names), and drafts through a
copy of those rows of the target's head, made when it is attached: a round's projections then
cost draft vocab / vocab of the whole head's. Training projects onto the whole head; the map is
installed at export (the most frequent supervised tokens of the run's data, as vLLM truncates
Medusa's heads), so the draft vocabulary changes how a drafter drafts, never how it learned.
"""

from __future__ import annotations

import torch
from torch import nn

from .drafter_io import DrafterError

#: the map's tensors in a drafter's weights
MAP_KEYS = ("d2t", "t2d")


def register_vocab_map(module: nn.Module, vocab: int, draft_vocab: int) -> None:
    """Give `module` the map's buffers (the first `draft_vocab` ids until one is installed)."""
    module.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[:draft_vocab] = True
    module.register_buffer("t2d", t2d)


def install_vocab_map(module: nn.Module, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    """Give `module` (whose `fields` hold `vocab_size`; its `head` a `TargetHead` once attached)
    the draft vocabulary `d2t`/`t2d`: its buffers, registered or overwritten,
    `fields["draft_vocab_size"]`, and a head drafting over those rows."""
    vocab = module.fields["vocab_size"]
    check_vocab_map(d2t, t2d, vocab, type(module).__name__)
    device = next(module.parameters()).device
    if getattr(module, "d2t", None) is None or module.d2t.shape != d2t.shape:
        register_vocab_map(module, vocab, len(d2t))
    module.d2t.copy_(d2t.to(device))
    module.t2d.copy_(t2d.to(device))
    module.fields["draft_vocab_size"] = len(d2t)
    if getattr(module, "head", None) is not None:  # not a submodule: never saved
        object.__setattr__(module, "head", TargetHead(module.head.lm_head, module.d2t))


def kept_ids(d2t: torch.Tensor) -> torch.Tensor:
    """The target id of every draft id."""
    return d2t + torch.arange(len(d2t), device=d2t.device)


def check_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor, vocab: int, where: str) -> None:
    """Refuse a map whose ids are not distinct ascending ids of the target's vocabulary, or
    whose `t2d` marks others than `d2t` keeps."""
    ids = kept_ids(d2t.long())
    if len(ids) == 0 or len(t2d) != vocab:
        raise DrafterError(f"{where}: a draft vocabulary map needs d2t ids and a t2d of {vocab}")
    if int(ids[0]) < 0 or int(ids[-1]) >= vocab or not bool((ids[1:] > ids[:-1]).all()):
        raise DrafterError(
            f"{where}: d2t does not map draft ids to distinct ascending ids below {vocab}"
        )
    marked = torch.zeros(vocab, dtype=torch.bool, device=t2d.device)
    marked[ids.to(t2d.device)] = True
    if not bool((marked == t2d.bool()).all()):
        raise DrafterError(f"{where}: t2d marks other target ids than d2t keeps")


class TargetHead:
    """The target's `lm_head` as a drafter projects with it: the whole head (`d2t` None), or a
    copy of its rows for the draft vocabulary. Not a module: nothing of it is saved."""

    def __init__(self, lm_head: nn.Module, d2t: torch.Tensor | None) -> None:
        self.lm_head = lm_head
        self.vocab = lm_head.weight.shape[0]
        self.ids = None if d2t is None else kept_ids(d2t).to(lm_head.weight.device)
        self.rows = None if self.ids is None else lm_head.weight.detach()[self.ids].clone()

    def draft_logits(self, states: torch.Tensor) -> torch.Tensor:
        """Logits [..., draft vocab] (the whole vocabulary without a map)."""
        if self.rows is None:
            return self.lm_head(states.to(self.lm_head.weight.dtype))
        return nn.functional.linear(states.to(self.rows.dtype), self.rows)

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """Logits [..., vocab]: the draft vocabulary's in place, -inf off it."""
        logits = self.draft_logits(states)
        if self.ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab), float("-inf"))
        return full.index_copy_(-1, self.ids, logits)


class DraftVocabHead(nn.Module):
    """A causal LM's own output head drafting over a draft vocabulary: a copy of the kept rows
    is projected, the logits come back over the whole vocabulary with -inf off the map (so a
    drafter's sampling and argmax stay as they are). Installed at load, never saved."""

    def __init__(self, lm_head: nn.Module, d2t: torch.Tensor) -> None:
        super().__init__()
        self.head = TargetHead(lm_head, d2t)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.head.logits(states)
