"""Speculative sampling is distributed as target-only sampling.

On a model with 6 tokens, the exact distribution of 3-token continuations (216 outcomes) is
enumerated from the target's conditionals. N speculative samples give an empirical
distribution; its total-variation distance to the exact one is tested against

    threshold = sum_i sqrt(p_i (1 - p_i) / N) / 2  +  sqrt(ln(1 / delta) / (2 N)).

The first term bounds E[TV] (Jensen: E|p_hat_i - p_i| <= sd); TV changes by at most 1/N per
sample, so McDiarmid bounds P(TV > E[TV] + t) <= exp(-2 N t^2) = delta for the second term.
delta = 1e-6: a correct sampler fails this test with probability below one in a million.
A control checks that the test has power: taking the draft's samples unverified fails it.
"""

import itertools
import math
from collections import Counter

import pytest
import torch

from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.proposers.draft_lm import DraftModelProposer
from draftzoo.inference.sampling import SamplingParams, probabilities, sample
from tests.inference.helpers import TopKTreeProposer

VOCAB, LENGTH, SAMPLES, DELTA = 6, 3, 3000, 1e-6
PROMPT = [1, 4]


def _tiny_lm(seed: int, sharpness: float):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=32,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )
    ).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    return model


@torch.no_grad()
def _exact_distribution(model, params):
    dist = {}
    for seq in itertools.product(range(VOCAB), repeat=LENGTH):
        logits = model(input_ids=torch.tensor([PROMPT + list(seq)])).logits[0]
        probs = probabilities(logits[len(PROMPT) - 1 : -1], params)
        dist[seq] = math.prod(probs[i, t].item() for i, t in enumerate(seq))
    return dist


def _tv(counts: Counter, exact: dict) -> float:
    return 0.5 * sum(abs(counts[k] / SAMPLES - p) for k, p in exact.items())


def _threshold(exact: dict) -> float:
    expected = 0.5 * sum(math.sqrt(p * (1 - p) / SAMPLES) for p in exact.values())
    return expected + math.sqrt(math.log(1 / DELTA) / (2 * SAMPLES))


PARAMS = SamplingParams(temperature=1.0, top_k=5, max_new_tokens=LENGTH)


def sample_outcomes(generator) -> tuple[Counter, int]:
    """SAMPLES seeded continuations of PROMPT: their counts and the draft tokens accepted."""
    counts, accepted = Counter(), 0
    for seed in range(SAMPLES):
        params = SamplingParams(temperature=1.0, top_k=5, max_new_tokens=LENGTH, seed=seed)
        out = generator.generate(PROMPT, params)
        counts[tuple(out.token_ids)] += 1
        accepted += out.metrics.num_accepted_tokens
    return counts, accepted


@pytest.fixture(scope="module")
def target_exact():
    target = _tiny_lm(seed=0, sharpness=30.0)
    return target, _exact_distribution(target, PARAMS)


def _eagle3(target, tree: bool, static: bool = False):
    """An untrained EAGLE-3 drafter over a pruned 4-of-6 draft vocabulary (q is 0 on two
    tokens the target can emit), its head started from the target's rows; `static`: on the
    static drafter cache's graph buffers (chains: Gumbel-max draws, run eagerly off CUDA;
    sampled trees: on its scratch slots)."""
    from draftzoo.architectures.eagle import EagleConfig, build_eagle, init_draft_head
    from draftzoo.architectures.target import TargetAdapter
    from draftzoo.inference.proposers.eagle import EagleProposer, TreeSettings

    torch.manual_seed(3)
    adapter = TargetAdapter(target)
    drafter = build_eagle(EagleConfig(layers=(0, 1, 2), draft_vocab_size=4), adapter)
    kept = torch.tensor([0, 2, 3, 5])
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[kept] = True
    drafter.set_vocab_map(kept - torch.arange(4), t2d)
    init_draft_head(drafter, adapter)
    # the tree: 2 sampled children per node, the 3 best nodes of each depth expanded (3 of
    # the 4 nodes at depth 2 get children), 12 tokens
    tree_settings = TreeSettings(top_k=3, depth=3, total_tokens=12, sampled_children=2)
    cache = CacheSettings(static=static, max_length=64)
    proposer = EagleProposer(drafter.eval(), tree_settings if tree else None, cache)
    if static:
        proposer.slots.use_graphs = True
    return proposer


def _medusa(target, tree: bool, static: bool = False):
    """Three Medusa heads with random blocks (so they disagree with the target), as a sampled
    chain or a static tree of 9 nodes (top-2 children, 3 deep); `static`: on the buffers a
    CUDA graph captures (run eagerly off CUDA)."""
    from draftzoo.architectures.medusa import MedusaConfig, build_medusa
    from draftzoo.architectures.target import TargetAdapter
    from draftzoo.inference.proposers.medusa import MedusaProposer, MedusaTree

    torch.manual_seed(5)
    adapter = TargetAdapter(target)
    heads = build_medusa(MedusaConfig(num_heads=3), adapter)
    with torch.no_grad():
        for block in heads.blocks:
            block.layers[0].weight.normal_(0, 0.5)
    choices = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0))
    proposer = MedusaProposer(
        heads.eval(),
        adapter.num_layers,
        MedusaTree(choices) if tree else None,
        CacheSettings(static=static),
    )
    proposer.use_graphs = static
    return proposer


def _mtp(target, static: bool = False):
    """Two untrained MTP modules (post_norm from the target's final norm), drafting chains of
    3 (module 1, module 2, then module 2 reused): every draft sampled from its q; `static`: on
    the buffers a CUDA graph captures (run eagerly off CUDA)."""
    from draftzoo.architectures.mtp import MtpConfig, build_mtp
    from draftzoo.architectures.target import TargetAdapter
    from draftzoo.inference.proposers.mtp import MtpProposer

    torch.manual_seed(4)
    drafter = build_mtp(MtpConfig(depth=2), TargetAdapter(target)).eval()
    proposer = MtpProposer(drafter, CacheSettings(static=static, max_length=64))
    if static:
        proposer.slots.use_graphs = True
    return proposer


@pytest.mark.parametrize(
    "case",
    [
        "mtp-chain",
        "mtp-chain-static",
        "medusa-chain",
        "medusa-tree",
        "medusa-tree-static",
        "draft-lm-similar",
        "draft-lm-bad",
        "tree-deterministic",
        "eagle3-chain-pruned-vocab",
        "eagle3-chain-static",
        "eagle3-tree",
        "eagle3-tree-static",
        "target-only",
    ],
)
def test_speculative_sampling_matches_the_target_distribution(target_exact, case):
    target, exact = target_exact
    assert abs(sum(exact.values()) - 1) < 1e-5
    bad = _tiny_lm(seed=7, sharpness=60.0)  # confident and wrong
    similar = _tiny_lm(seed=0, sharpness=15.0)  # the target, less sharp
    proposer = {
        "draft-lm-similar": DraftModelProposer(similar),
        "draft-lm-bad": DraftModelProposer(bad),
        "tree-deterministic": TopKTreeProposer(bad, width=2),
        "target-only": None,
    }.get(case)
    if case.startswith("eagle3"):
        proposer = _eagle3(target, "tree" in case, case.endswith("static"))
    if case.startswith("medusa"):
        proposer = _medusa(target, "tree" in case, case.endswith("static"))
    if case.startswith("mtp"):
        proposer = _mtp(target, case.endswith("static"))
    trees = (
        "eagle3-tree",
        "eagle3-tree-static",
        "medusa-tree",
        "medusa-tree-static",
        "mtp-chain",
        "mtp-chain-static",
    )
    gamma = 3 if case in trees else 2  # a tree's depth
    generator = SpeculativeGenerator(target, None, proposer, num_speculative_tokens=gamma)
    counts, accepted = sample_outcomes(generator)
    tv, threshold = _tv(counts, exact), _threshold(exact)
    assert tv < threshold, f"TV {tv:.4f} >= {threshold:.4f}"
    if case != "target-only":
        assert accepted > 0  # the drafts really were used


def test_unverified_draft_samples_fail_the_same_test(target_exact):
    """Power check: the draft's own distribution is far outside the tolerance."""
    _, exact = target_exact
    bad = _tiny_lm(seed=7, sharpness=60.0)
    draft_exact = _exact_distribution(bad, PARAMS)
    tv_of_draft = 0.5 * sum(abs(draft_exact[k] - p) for k, p in exact.items())
    assert tv_of_draft > 3 * _threshold(exact)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_batched_speculative_sampling_matches_the_target_distribution(target_exact, static):
    """Ragged batches (a one-token prompt among the measured ones), a confidently bad draft;
    on the growing cache and on the static one's graph buffers."""
    from draftzoo.inference.batch import BatchGenerator

    target, exact = target_exact
    bad = _tiny_lm(seed=7, sharpness=60.0)
    batch = BatchGenerator(
        target,
        None,
        lambda: DraftModelProposer(bad),
        num_speculative_tokens=2,
        cache=CacheSettings(static=static, max_length=32),
    )
    if static:
        batch._forward(4).use_graphs = True
    counts, accepted = Counter(), 0
    for seed in range(SAMPLES // 3):
        params = SamplingParams(temperature=1.0, top_k=5, max_new_tokens=LENGTH, seed=seed)
        out = batch.generate([PROMPT, [3], PROMPT, PROMPT], params)
        for row in (0, 2, 3):
            counts[tuple(out.outputs[row].token_ids)] += 1
            accepted += out.outputs[row].metrics.num_accepted_tokens
    tv, threshold = _tv(counts, exact), _threshold(exact)
    assert tv < threshold, f"TV {tv:.4f} >= {threshold:.4f}"
    assert accepted > 0


def test_sample_draws_each_token_with_its_probability(monkeypatch):
    """`sample` (one uniform draw through the CDF) against the same TV bound, on an unnormalised
    distribution with zero-mass tokens; a draw that rounds onto the total returns the last token
    with mass, never a zero-mass one."""
    weights = torch.tensor([0.0, 0.2, 0.0, 1.2, 0.5, 0.1, 0.0])
    exact = {i: w / weights.sum().item() for i, w in enumerate(weights.tolist())}
    generator = torch.Generator().manual_seed(0)
    counts = Counter(sample(weights, generator) for _ in range(SAMPLES))
    assert all(counts[i] == 0 for i, p in exact.items() if p == 0)
    assert _tv(counts, exact) < _threshold(exact)
    monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: torch.tensor(1.0))
    assert sample(weights, generator) == 5


def test_device_chain_acceptance_draws_what_the_sequential_walk_draws():
    """`accept_chain_on_device` (a device-drafted sampled chain, one read) against the exact
    distribution of (accepted prefix, next token) the sequential rejection walk gives, on
    random p and q (the TV bound above, 18 outcomes)."""
    from draftzoo.inference.acceptance import accept_chain_on_device
    from draftzoo.inference.tree import Proposal

    torch.manual_seed(0)
    p = torch.randn(3, VOCAB).mul(2).softmax(-1)  # the target at the root and 2 drafts
    q = torch.randn(2, VOCAB).mul(2).softmax(-1)
    drafts = [int(q[0].argmax()), int(q[1].argmin())]  # a likely and an unlikely draft
    exact, reach = {}, 1.0
    for k, token in enumerate(drafts):
        keep = min(1.0, (p[k, token] / q[k, token]).item())
        residual = (p[k] - q[k]).clamp_min(0)
        residual /= residual.sum()
        for t in range(VOCAB):
            exact[(k, t)] = reach * (1 - keep) * residual[t].item()
        reach *= keep
    for t in range(VOCAB):
        exact[(2, t)] = reach * p[2, t].item()
    params = SamplingParams(temperature=1.0)
    generator = torch.Generator().manual_seed(1)
    counts = Counter()
    logits = p.log()
    for _ in range(SAMPLES):
        proposal = Proposal.chain(torch.tensor(drafts), q)
        accepted, token = accept_chain_on_device(logits, proposal, params, generator)
        assert proposal.tokens == drafts and accepted == list(range(len(accepted)))
        counts[(len(accepted), token)] += 1
    assert _tv(counts, exact) < _threshold(exact)


def test_typical_acceptance_is_lossy_and_never_the_default(target_exact):
    """Medusa's typical acceptance, asked for explicitly, leaves the target's distribution
    (measured: TV far beyond the tolerance the exact path meets), while SamplingParams, the
    evaluation and both CLI commands default to exact acceptance."""
    from dataclasses import replace

    from draftzoo.cli import build_parser
    from draftzoo.eval.runner import EvalConfig

    target, exact = target_exact
    generator = SpeculativeGenerator(target, None, _medusa(target, tree=True), 3)
    counts = Counter()
    for seed in range(SAMPLES):
        params = replace(PARAMS, seed=seed, acceptance="typical")
        assert params.lossy
        counts[tuple(generator.generate(PROMPT, params).token_ids)] += 1
    tv, threshold = _tv(counts, exact), _threshold(exact)
    assert tv > 2 * threshold, f"typical acceptance TV {tv:.4f} vs tolerance {threshold:.4f}"
    assert SamplingParams().acceptance == "exact" and not SamplingParams().lossy
    assert EvalConfig().acceptance == "exact"
    parser = build_parser()
    assert parser.parse_args(["generate", "--prompt", "x"]).acceptance == "exact"
    assert parser.parse_args(["eval", "some-drafter"]).acceptance == "exact"


@pytest.mark.parametrize("family", ["draft-lm", "eagle3-chain", "eagle3-tree"])
def test_a_drafter_with_nan_weights_still_gives_the_target_distribution(target_exact, family):
    """Weights full of NaN: q is no distribution, so its drafts count as deterministic (q
    one-hot) or, for a draft LM that cannot sample, are not made; the output stays the
    target's, within the same TV threshold."""
    target, exact = target_exact
    if family == "draft-lm":
        broken = _tiny_lm(seed=7, sharpness=60.0)
        proposer = DraftModelProposer(broken)
        module = broken
    else:
        proposer = _eagle3(target, family.endswith("tree"))
        module = proposer.drafter
    shared = {p.data_ptr() for p in target.parameters()}  # EAGLE reads the target's head
    with torch.no_grad():
        for parameter in module.parameters():
            if parameter.data_ptr() not in shared:
                parameter.fill_(float("nan"))
    assert all(torch.isfinite(p).all() for p in target.parameters())
    generator = SpeculativeGenerator(target, None, proposer, num_speculative_tokens=2)
    counts, _ = sample_outcomes(generator)
    tv, threshold = _tv(counts, exact), _threshold(exact)
    assert tv < threshold, f"TV {tv:.4f} >= {threshold:.4f}"
