"""The CPU verification kernels: packed weights and in-place grouped-query attention give the
stock forward's logits, leave the model as they found it, and pack once per width."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from draftzoo.inference import cpu_kernels
from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.cpu_kernels import ATTENTION, CpuKernels, unavailable_reason
from draftzoo.inference.errors import GenerationError
from draftzoo.inference.growing_forward import GrowingForward
from draftzoo.inference.static_forward import StaticForward
from draftzoo.inference.tree import Proposal
from tests.conftest import tiny_causal_lm

pytestmark = pytest.mark.skipif(
    unavailable_reason(torch.nn.Linear(2, 2)) is not None, reason="no MKL in this torch"
)

PREFIX = 20


@pytest.fixture(autouse=True)
def _pack_every_weight(monkeypatch):
    """The tiny models' weights are far below the size the kernels pack: pack them all."""
    monkeypatch.setattr(cpu_kernels, "MIN_PACKED_ELEMENTS", 0)


def _forwards(model, static: bool, kernels):
    if static:
        return StaticForward(model, 128, kernels=kernels)
    return GrowingForward(model, kernels)


def _after_prefix(forward, prefix):
    forward.reset(1)
    forward.forward(prefix, None, None, all_logits=False)
    forward.commit([list(range(prefix.shape[1]))])
    return forward


def _tree(width: int):
    nodes = width - 1
    proposal = Proposal([0] * nodes, [i // 2 - 1 for i in range(nodes)])
    return tuple(t[None] for t in proposal.layout(torch.device("cpu")))


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("static", [False, True])
@torch.no_grad()
def test_verification_logits_equal_the_stock_forwards(kind, static):
    model = tiny_causal_lm(kind)
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 96, (1, PREFIX), generator=generator)
    ids = torch.randint(0, 96, (1, 64), generator=generator)
    stock = _after_prefix(_forwards(model, static, None), prefix)
    fast = _after_prefix(_forwards(model, static, CpuKernels(model)), prefix)
    for width in (2, 5, 8, 9, 17, 33, 64):
        for depths, ancestors in ((None, None), _tree(width)):
            expected = stock.forward(ids[:, :width], depths, ancestors)
            got = fast.forward(ids[:, :width], depths, ancestors)
            torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
            stock.rollback([PREFIX])
            fast.rollback([PREFIX])


@torch.no_grad()
def test_the_model_is_left_as_found_even_when_the_forward_fails():
    model = tiny_causal_lm("llama")
    kernels = CpuKernels(model)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(kernels.linears) == len(linears)
    with kernels.active():
        assert all("forward" in vars(m) for m in linears)
        assert model.config._attn_implementation == ATTENTION
    assert not any("forward" in vars(m) for m in linears)
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(IndexError), kernels.active():
        model(input_ids=torch.tensor([[0, 500]]))  # out of the vocabulary
    assert not any("forward" in vars(m) for m in linears)
    assert model.config._attn_implementation == "sdpa"


@torch.no_grad()
def test_one_packed_copy_per_width_kept_until_the_weight_changes():
    model = tiny_causal_lm("llama")
    kernels = CpuKernels(model)
    forward = _after_prefix(GrowingForward(model, kernels), torch.arange(PREFIX)[None])
    ids = torch.arange(30, 60)[None]
    assert kernels.packed_bytes() == 0  # the prefill runs on the stock kernels
    forward.forward(ids[:, :1], None, None)  # one token: the stock decode step
    forward.rollback([PREFIX])
    assert kernels.packed_bytes() == 0
    for width in (3, 5, 8):  # all padded to 8 rows
        forward.forward(ids[:, :width], None, None)
        forward.rollback([PREFIX])
    assert {w for _, w in kernels._packed} == {8}
    held = dict(kernels._packed)
    forward.forward(ids[:, :9], None, None)
    forward.rollback([PREFIX])
    assert {w for _, w in kernels._packed} == {8, 16}
    assert all(kernels._packed[key][0] is value[0] for key, value in held.items())

    stock = _after_prefix(GrowingForward(model), torch.arange(PREFIX)[None])
    with torch.no_grad():
        model.lm_head.weight.mul_(2)  # the packed copy of the head is now stale
    got = forward.forward(ids[:, :5], None, None)
    torch.testing.assert_close(got, stock.forward(ids[:, :5], None, None), atol=2e-5, rtol=1e-4)


def test_settings_choose_the_kernels_and_refuse_them_where_they_cannot_run():
    model = tiny_causal_lm("llama")
    kernels = CacheSettings().kernels_for(model)
    assert isinstance(kernels, CpuKernels)
    assert CacheSettings(cpu_kernels=True).kernels_for(model) is kernels  # one per target
    assert CacheSettings(cpu_kernels=False).kernels_for(model) is None
    alive = weakref.ref(model)
    del model, kernels
    gc.collect()
    assert alive() is None  # the shared kernels do not keep their target alive
    half = tiny_causal_lm("llama").to(torch.bfloat16)
    assert CacheSettings().kernels_for(half) is None  # where they apply: quietly off
    with pytest.raises(GenerationError, match="asked for, but the target's weights are "):
        CacheSettings(cpu_kernels=True).kernels_for(half)


def test_the_report_says_which_kernels_verified():
    from draftzoo.inference.cpu_kernels import NOTE

    model = tiny_causal_lm("llama")
    assert CacheSettings().kernels_note(model) == NOTE
    assert CacheSettings(cpu_kernels=False).kernels_note(model) == "stock (asked)"
    half = tiny_causal_lm("llama").to(torch.bfloat16)
    assert CacheSettings().kernels_note(half) == (
        "stock (the target's weights are torch.bfloat16, not float32)"
    )


@torch.no_grad()
def test_greedy_speculation_on_the_kernels_equals_target_only(tiny_target_model):
    from draftzoo.inference.generate import SpeculativeGenerator
    from draftzoo.inference.proposers.prompt_lookup import PromptLookupProposer
    from draftzoo.inference.sampling import SamplingParams

    model, tokenizer, _ = tiny_target_model
    params = SamplingParams(max_new_tokens=48)
    plain = SpeculativeGenerator(model, tokenizer, cache=CacheSettings(cpu_kernels=False))
    lookup = PromptLookupProposer(min_ngram=1, max_ngram=3)
    fast = SpeculativeGenerator(model, tokenizer, lookup, 6, cache=CacheSettings(cpu_kernels=True))
    drafted = 0
    for prompt in ("def add(a, b):\n    return", "import os\nimport sys\n\ndef main():"):
        out = fast.generate(prompt, params)
        assert out.token_ids == plain.generate(prompt, params).token_ids
        drafted += out.metrics.num_drafts
    assert drafted > 0 and fast.forward.kernels.packed_bytes() > 0


@pytest.mark.parametrize("stock", [False, True])
def test_generate_builds_the_kernels_unless_told_stock(testbed_tiny, monkeypatch, capsys, stock):
    from draftzoo.cli import main

    built = []
    real_init = CpuKernels.__init__

    def counting_init(self, model):
        built.append(model)
        real_init(self, model)

    monkeypatch.setattr(CpuKernels, "__init__", counting_init)
    argv = ["generate", "--target", str(testbed_tiny[0]), "--prompt-lookup"]
    argv += ["--prompt", "def add(a, b):\n", "--max-new-tokens", "8"]
    assert main(argv + (["--stock-kernels"] if stock else [])) == 0
    assert capsys.readouterr().out.startswith("def add(a, b):\n")
    assert len(built) == (0 if stock else 1)
