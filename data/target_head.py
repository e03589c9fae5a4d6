"""The target's head over its final post-norm states, as the losses read it.

Target logits are never stored: `target_head_logits` recomputes them from the final state
(HF index N) and the target's lm_head, as SpecForge does. Where a loss scores a draft
vocabulary it still needs two things over the whole vocabulary, the argmax (positions whose
argmax lies outside carry no loss) and, for the acceptance losses, the log-normaliser; an
offline capture keeps those two per token (`whole_vocab_reads`, 8 bytes), and the loss then
projects only the head's kept rows (`kept_head_logits`): on SmolLM2 8,192 of 49,152.
"""

from __future__ import annotations

import weakref

import torch

#: the keys of a capture's reads beside its states (`capture.teacher_reads`), in a shard and
#: in the features a trainer gets: argmax [tokens] int32 and log-normaliser [tokens] float32
#: over the whole vocabulary, of the final states as stored
TEACHER_ARGMAX, TEACHER_LOG_NORM = "teacher.argmax", "teacher.log_norm"
READ_ROWS = 512  # rows projected at a time: a block's whole-vocabulary logits stay small


def target_head_logits(adapter, final_hidden: torch.Tensor) -> torch.Tensor:
    """Target logits [.., vocab] from the final post-norm hidden state, as the target returns
    them (`TargetAdapter.finish_logits` of its head's output), in the head's compute dtype."""
    return adapter.finish_logits(head_output(adapter, final_hidden))


def head_output(adapter, final_hidden: torch.Tensor) -> torch.Tensor:
    """The target's head [.., vocab] over states, in the head's compute dtype (bfloat16 under
    bfloat16 autocast). A frozen plain head's weight is cast to the autocast dtype once and
    kept while it is unchanged: autocast casts a weight that needs no gradient again at every
    call (68 ms for SmolLM2's head on two cores), and losses read the head a chunk of rows at
    a time. The values are autocast's own."""
    head = adapter.lm_head
    device = final_hidden.device.type
    frozen = type(head) is torch.nn.Linear and not head.weight.requires_grad
    if not (frozen and torch.is_autocast_enabled(device)):
        return head(final_hidden.to(head.weight.dtype))
    dtype = torch.get_autocast_dtype(device)
    bias = None if head.bias is None else _cast_once(head.bias, dtype)
    return torch.nn.functional.linear(final_hidden.to(dtype), _cast_once(head.weight, dtype), bias)


_CASTS: dict[int, tuple] = {}  # id(tensor) -> (weakref to it, its version, dtype, the cast)


def _cast_once(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`tensor.to(dtype)`, kept until `tensor` changes in place (its version counter moves)."""
    kept = _CASTS.get(id(tensor))
    if kept is None or kept[0]() is not tensor or kept[1:3] != (tensor._version, dtype):
        for key in [k for k, v in _CASTS.items() if v[0]() is None]:
            del _CASTS[key]
        kept = (weakref.ref(tensor), tensor._version, dtype, tensor.detach().to(dtype))
        _CASTS[id(tensor)] = kept
    return kept[3]


def target_logits(adapter, final_hidden: torch.Tensor) -> torch.Tensor:
    """Target logits [.., vocab] (float32) from the final post-norm hidden state."""
    return target_head_logits(adapter, final_hidden).float()


_ROWS: dict[tuple[int, int], tuple] = {}  # (id(tensor), id(rows)) -> (weakrefs, versions, ...)


def _rows_once(tensor: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`tensor[rows].to(dtype)`, kept until `tensor` or `rows` changes in place."""
    key = (id(tensor), id(rows))
    kept = _ROWS.get(key)
    state = (tensor._version, rows._version, dtype)
    if kept is None or kept[0]() is not tensor or kept[1]() is not rows or kept[2] != state:
        for stale in [k for k, v in _ROWS.items() if v[0]() is None or v[1]() is None]:
            del _ROWS[stale]
        taken = tensor.detach()[rows].to(dtype).contiguous()
        kept = (weakref.ref(tensor), weakref.ref(rows), state, taken)
        _ROWS[key] = kept
    return kept[3]


def kept_head_logits(adapter, kept: torch.Tensor, final_hidden: torch.Tensor) -> torch.Tensor:
    """`target_head_logits(adapter, final_hidden)[..., kept]` (`kept`: a bool mask or the ids
    of vocabulary entries), projecting only those rows of a frozen plain head (their copy is
    kept while head and `kept` are unchanged); the whole head otherwise."""
    head = adapter.lm_head
    if type(head) is not torch.nn.Linear or head.weight.requires_grad:
        return target_head_logits(adapter, final_hidden)[..., kept]
    device = final_hidden.device.type
    autocast = torch.is_autocast_enabled(device)
    dtype = torch.get_autocast_dtype(device) if autocast else head.weight.dtype
    weight = _rows_once(head.weight, kept, dtype)
    bias = None if head.bias is None else _rows_once(head.bias, kept, dtype)
    out = torch.nn.functional.linear(final_hidden.to(dtype), weight, bias)
    return adapter.finish_logits(out)


@torch.no_grad()
def whole_vocab_reads(adapter, final_hidden: torch.Tensor) -> dict[str, torch.Tensor]:
    """The argmax (int32) and log-normaliser (float32) over the whole vocabulary of the target's
    logits at each row of `final_hidden` [n, h]: what a loss reading those states computes
    (`train/teacher_reads.py`), READ_ROWS rows at a time."""
    argmax, norm = [], []
    for lo in range(0, final_hidden.shape[0], READ_ROWS):
        logits = target_head_logits(adapter, final_hidden[lo : lo + READ_ROWS])
        argmax.append(logits.argmax(-1).to(torch.int32))
        norm.append(torch.logsumexp(logits.float(), dim=-1))
    if not argmax:
        empty = final_hidden.new_zeros(0)
        return {TEACHER_ARGMAX: empty.to(torch.int32), TEACHER_LOG_NORM: empty.float()}
    return {TEACHER_ARGMAX: torch.cat(argmax), TEACHER_LOG_NORM: torch.cat(norm)}
