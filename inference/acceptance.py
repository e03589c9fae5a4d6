"""Acceptance: which draft tokens the target keeps, and the token it adds.

Greedy: walk down the tree while a child equals the target's argmax; the target's argmax at
the first mismatch (or after the last accepted node) is the correction / bonus token. A tree
still on the device is accepted there by the same rule, in one host read.

Sampling (lossless): at each node, test its children in order. A child x drawn from q is
accepted with probability min(1, p(x) / q(x)); on rejection p becomes normalize(max(0, p - q))
for the next sibling (SpecInfer's recursive rejection, siblings drawn i.i.d. from q). A child
from a deterministic proposer is the same rule with q one-hot at x: accepted with probability
p(x), after which x is removed from p. When every child is rejected, the next token is sampled
from what remains of p; after a fully accepted path, the bonus token is sampled from p at the
leaf. Each step is exact, so the output is distributed as target-only sampling.

A chain drafted on the device (its tokens not read yet) is accepted by the same rule on the
device, in one host read: one uniform per draft token tests them all at once, the accepted
prefix ends at the first rejection, and the next token is drawn (by inverting the CDF with one
more uniform) from the residual there, or from p at the leaf after a fully accepted chain —
for a chain, exactly the distribution of the sequential walk above.

Typical (Medusa's typical acceptance; opt-in, LOSSY, only with `acceptance="typical"` at
T > 0): a node passes when the target finds its token typical enough at its parent, p(x) >
min(epsilon, delta x exp(-H(p))); the deepest node whose whole path passes is accepted (the
first such in tree order), and the next token is sampled from p restricted to its typical
tokens (the argmax when none is). Not distributed as the target: it favours likely tokens.
"""

from __future__ import annotations

import torch

from .sampling import SamplingParams, is_distribution, probabilities, sample
from .tree import Proposal


def accept_greedy(target_argmax: list[int], proposal: Proposal) -> tuple[list[int], int]:
    """Greedy acceptance. `target_argmax[s]` is the target's argmax at slot s (0 = root)."""
    accepted: list[int] = []
    slot = 0
    while True:
        want = target_argmax[slot]
        match = next((c for c in proposal.children[slot] if proposal.tokens[c] == want), None)
        if match is None:
            return accepted, want
        accepted.append(match)
        slot = match + 1


def greedy_answer(target_logits: torch.Tensor, proposal: Proposal) -> list[int]:
    """The target's argmax at every slot, read from the device once: together with the draft
    tokens when those are still there (a round's one host read)."""
    return greedy_answers(target_logits[None], [proposal])[0]


def greedy_answers(target_logits: torch.Tensor, proposals: list[Proposal]) -> list[list[int]]:
    """`greedy_answer` of every row of a batch (logits [R, q, vocab], row r's first
    len(proposals[r]) + 1 positions its own), with every row's drafts still on the device, in
    one host read."""
    argmax = target_logits.argmax(-1)  # [R, q]
    pending = [part.long() for proposal in proposals for part in proposal.on_device()]
    read = torch.cat([argmax.flatten(), *pending]).tolist()
    rows, q = argmax.shape
    rest = read[rows * q :]
    for proposal in proposals:
        rest = proposal.take(rest)
    return [read[r * q : r * q + len(p) + 1] for r, p in enumerate(proposals)]


def accept_greedy_tree_on_device(
    target_logits: torch.Tensor, proposal: Proposal
) -> tuple[list[int], int]:
    """`accept_greedy` for a tree still on the device (tokens, parents, layout), with one host
    read: a node passes when its token is the target's argmax at its parent, a slot is on the
    accepted path when it and all its ancestors pass, and the path ends at the deepest such
    slot (siblings hold distinct tokens, so at most one per depth passes with its parent)."""
    argmax = target_logits.argmax(-1)  # [n+1]
    device = argmax.device
    depths, ancestors = proposal.layout(device)
    parents = proposal.device_parents.to(device)
    passes = proposal.device_tokens.to(device) == argmax.index_select(0, parents + 1)
    passes = torch.cat([torch.ones(1, dtype=torch.bool, device=device), passes])  # the root
    on_path = ~(ancestors & ~passes).any(-1)  # [n+1]
    deepest = (depths * on_path).argmax()  # the root (slot 0) when nothing passed
    # index_select, not argmax[deepest]: indexing by a device scalar reads it on the host
    taken = argmax.index_select(0, deepest[None])
    slot, token = proposal.read_with(torch.cat([deepest[None], taken]))
    return (proposal.path_to(slot - 1) if slot else []), token


# A drafted token is accepted against the q it was drawn from. Where the proposal carries no q
# (deterministic drafts), or a q that is not a distribution or gives the token no mass (a
# drafter whose weights hold NaN or Inf), the token is taken as deterministic: q one-hot on it.
# That is exact for any token chosen independently of the verification's draws (accepted with
# probability p(x), else drawn from the residual of p without x), so the output stays the
# target's however bad the drafter; only the acceptance is lower.


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    residual = (p - q).clamp_min(0.0)
    total = residual.sum()
    # p <= q everywhere means rejection had probability 0; keep p rather than divide by 0.
    return residual / total if total > 0 else p


def accept_sampling(
    target_logits: torch.Tensor,  # [n+1, vocab], slot 0 = root
    proposal: Proposal,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[list[int], int]:
    """Lossless rejection-sampling acceptance over a chain or a tree."""
    accepted: list[int] = []
    slot = 0
    while True:
        p = probabilities(target_logits[slot], params)
        for child in proposal.children[slot]:
            token = proposal.tokens[child]
            q = None if proposal.draft_probs is None else proposal.draft_probs[child].float()
            if q is None or not (is_distribution(q) and q[token] > 0):
                q = torch.zeros_like(p)  # deterministic, or a q the token cannot come from
                q[token] = 1.0
            ratio = p[token] / q[token] if q[token] > 0 else torch.tensor(0.0)
            if torch.rand((), generator=generator, device=p.device) < ratio:
                accepted.append(child)
                slot = child + 1
                break
            p = _residual(p, q)
        else:
            return accepted, sample(p, generator)


def accept_chain_on_device(
    target_logits: torch.Tensor,  # [n+1, vocab], slot 0 = root
    proposal: Proposal,  # a sampled chain whose tokens are still on the device
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[list[int], int]:
    """Lossless acceptance of a device-drafted sampled chain with one host read."""
    n = len(proposal)
    device = target_logits.device
    tokens = proposal.device_tokens.to(device)
    p = probabilities(target_logits, params)  # [n+1, vocab]
    q = proposal.draft_probs.to(device).float()  # [n, vocab]
    rows = torch.arange(n, device=device)
    proper = is_distribution(q) & (
        q[rows, tokens] > 0
    )  # else: one-hot, see the note above `_residual`
    q = torch.where(proper[:, None], q, torch.nn.functional.one_hot(tokens, q.shape[-1]).float())
    uniforms = torch.rand(n + 1, generator=generator, device=device)
    passed = uniforms[:n] < p[rows, tokens] / q[rows, tokens]  # q > 0 where it was drawn
    count = passed.long().cumprod(0).sum()  # accepted prefix length
    residual = (p[:n] - q).clamp_min(0.0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p[:n])  # as `_residual`
    final = torch.cat([residual, p[n:]]).index_select(0, count.view(1))[0]
    cdf = final.cumsum(0)
    index = torch.searchsorted(cdf, uniforms[n] * cdf[-1], right=True)
    last_with_mass = (cdf >= cdf[-1]).int().argmax()  # a point rounded onto the total
    next_token = torch.minimum(index, last_with_mass)
    accepted, token = proposal.read_with(torch.stack([count, next_token]))
    return list(range(accepted)), token


def typical_tokens(p: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[vocab] bool: the tokens typical acceptance keeps under distribution `p`."""
    entropy = -(p * p.clamp_min(1e-30).log()).sum()
    threshold = torch.minimum(
        torch.tensor(params.typical_threshold, device=p.device),
        params.typical_alpha * torch.exp(-entropy),
    )
    return p > threshold


def accept_typical(
    target_logits: torch.Tensor,  # [n+1, vocab], slot 0 = root
    proposal: Proposal,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[list[int], int]:
    """Medusa's typical acceptance (LOSSY): the deepest node whose path is typical."""
    typical = [typical_tokens(probabilities(row, params), params) for row in target_logits]
    passes: list[bool] = []
    best, best_depth = -1, 0
    for node, (token, parent) in enumerate(zip(proposal.tokens, proposal.parents, strict=True)):
        above = passes[parent] if parent >= 0 else True
        passes.append(above and bool(typical[parent + 1][token]))
        depth = proposal.depths[node]
        if passes[node] and depth > best_depth:
            best, best_depth = node, depth
    accepted = proposal.path_to(best) if best >= 0 else []
    slot = accepted[-1] + 1 if accepted else 0
    p = probabilities(target_logits[slot], params)
    kept = p * typical[slot]
    return accepted, sample(kept, generator) if kept.sum() > 0 else int(p.argmax())


def accept(
    target_logits: torch.Tensor,
    proposal: Proposal,
    params: SamplingParams,
    generator: torch.Generator | None,
    answer: list[int] | None = None,
) -> tuple[list[int], int]:
    """Accepted node indices (root to leaf) and the target's next token (greedy: from the
    target's argmax per slot, `answer`, when it was read already)."""
    if params.greedy and answer is not None:
        return accept_greedy(answer, proposal)
    if params.greedy and proposal.tree_on_device:
        return accept_greedy_tree_on_device(target_logits, proposal)
    if params.greedy:
        return accept_greedy(greedy_answer(target_logits, proposal), proposal)
    if params.acceptance == "typical":
        return accept_typical(target_logits, proposal, params, generator)
    if proposal.unread and proposal.is_chain and proposal.draft_probs is not None:
        return accept_chain_on_device(target_logits, proposal, params, generator)
    return accept_sampling(target_logits, proposal, params, generator)
