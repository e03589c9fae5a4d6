"""CUDA graphs replay the static-cache forwards exactly (opt-in: `pytest -m gpu`).

On the committed testbed-small and the shipped zoo drafters, graphed greedy decoding must give
the tokens of eager target-only decoding on the same GPU, for target-only, the draft LM, and
EAGLE-3 chains and trees (whose target states are read back from the graphs' buffers), with
EAGLE chains and trees drafted by graphs too; a greedy round on static caches synchronises
with the device once (the read of the drafts with the target's answer); graphed batches give
the same tokens; every published drafter, loaded by `draftzoo.load` on static caches as it is
served (each family and the hybrid with suffix decoding), gives its own target's greedy tokens.
"""

import warnings

import pytest
import torch

from draftzoo.architectures.zoo_index import builtin_zoo_dir
from draftzoo.data.prompts import load_prompt_set
from draftzoo.inference.batch import BatchGenerator
from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.proposers.dflash import DflashProposer
from draftzoo.inference.proposers.draft_lm import DraftModelProposer
from draftzoo.inference.proposers.eagle import EagleProposer, TreeSettings
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.testbed import committed_testbed_dir

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def target_on_gpu():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = committed_testbed_dir()
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to("cuda").eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [p.render(tokenizer, chat=True) for p in load_prompt_set("humaneval")[:4]]
    return target, tokenizer, prompts


def _proposers(target, tokenizer):
    from transformers import AutoModelForCausalLM

    folder = builtin_zoo_dir() / "draft-lm-testbed-small"
    draft = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to("cuda").eval()
    eagle = EagleProposer.from_pretrained(builtin_zoo_dir() / "eagle3-testbed-small", target)
    dflash = DflashProposer.from_pretrained(builtin_zoo_dir() / "dflash-testbed-small", target)
    return {
        "target-only": None,
        "draft-lm": DraftModelProposer(draft, cache=CacheSettings(static=True)),
        "eagle3-chain": eagle,
        "eagle3-chain-graphed": EagleProposer(eagle.drafter, cache=CacheSettings(static=True)),
        "eagle3-tree": EagleProposer(eagle.drafter, TreeSettings()),
        "eagle3-tree-graphed": EagleProposer(
            eagle.drafter, TreeSettings(), cache=CacheSettings(static=True)
        ),
        "dflash": DflashProposer(dflash.drafter, cache=CacheSettings(static=True)),
    }


NAMES = [
    "target-only",
    "draft-lm",
    "eagle3-chain",
    "eagle3-chain-graphed",
    "eagle3-tree",
    "eagle3-tree-graphed",
]


@pytest.mark.parametrize("name", NAMES)
def test_graphed_greedy_output_equals_eager_target_only(target_on_gpu, name):
    target, tokenizer, prompts = target_on_gpu
    params = SamplingParams(max_new_tokens=64)
    eager = SpeculativeGenerator(target, tokenizer)
    proposer = _proposers(target, tokenizer)[name]
    graphed = SpeculativeGenerator(target, tokenizer, proposer, 4, cache=CacheSettings(static=True))
    assert graphed.forward.use_graphs
    for prompt in prompts:
        expected = eager.generate(prompt, params).token_ids
        assert graphed.generate(prompt, params).token_ids == expected, name
    assert graphed.forward._shapes, "no forward was replayed from a graph"


def _tau(generator, prompts, params) -> float:
    """Mean tokens per target forward over `prompts`."""
    tokens = forwards = 0
    for prompt in prompts:
        metrics = generator.generate(prompt, params).metrics
        tokens += metrics.num_generated_tokens
        forwards += metrics.num_target_forwards
    return tokens / forwards


@pytest.mark.parametrize("family", ["eagle1", "eagle3"])
def test_eagle_drafts_as_well_on_cuda_as_on_cpu(target_on_gpu, family):
    """An EAGLE chain accepts as many tokens on the GPU, eager and graphed, as on the CPU: the
    lossless check above cannot see target states that reach the drafter wrong, only this can.
    CUDA and CPU kernels round differently, so a few acceptances may flip: 10% tolerance."""
    from transformers import AutoModelForCausalLM

    target, tokenizer, prompts = target_on_gpu
    params = SamplingParams(max_new_tokens=64)
    folder = builtin_zoo_dir() / f"{family}-testbed-small"
    cpu_target = AutoModelForCausalLM.from_pretrained(
        committed_testbed_dir(), dtype=torch.float32
    ).eval()
    on_cpu = SpeculativeGenerator(
        cpu_target, tokenizer, EagleProposer.from_pretrained(folder, cpu_target), 4
    )
    proposer = EagleProposer.from_pretrained(folder, target)
    eager = SpeculativeGenerator(target, tokenizer, proposer, 4)
    graphed = SpeculativeGenerator(target, tokenizer, proposer, 4, cache=CacheSettings(static=True))
    drafter_graphed = SpeculativeGenerator(
        target,
        tokenizer,
        EagleProposer(proposer.drafter, cache=CacheSettings(static=True)),
        4,
        cache=CacheSettings(static=True),
    )
    expected = _tau(on_cpu, prompts, params)
    measured = {
        "eager": _tau(eager, prompts, params),
        "graphed": _tau(graphed, prompts, params),
        "graphed drafter": _tau(drafter_graphed, prompts, params),
    }
    assert expected > 2.5, f"the CPU reference itself drafts poorly: tau {expected:.2f}"
    assert all(tau >= 0.9 * expected for tau in measured.values()), (expected, measured)


@pytest.mark.parametrize(
    "name", ["target-only", "draft-lm", "eagle3-chain-graphed", "eagle3-tree-graphed", "dflash"]
)
def test_a_graphed_greedy_round_synchronises_once(target_on_gpu, name):
    """After a warm-up request on the same prompt (graph capture synchronises; the same
    greedy request captures the same shapes), every greedy round waits for the device once and
    nothing else does, the prefill included: `torch.cuda.set_sync_debug_mode` warns at each
    synchronising call."""
    target, tokenizer, prompts = target_on_gpu
    params = SamplingParams(max_new_tokens=32)
    proposer = _proposers(target, tokenizer)[name]
    graphed = SpeculativeGenerator(target, tokenizer, proposer, 4, cache=CacheSettings(static=True))
    graphed.generate(prompts[1], params)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = graphed.generate(prompts[1], params)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "called a synchronizing" in str(w.message)]
    rounds = out.metrics.num_target_forwards
    assert len(syncs) == rounds, f"{len(syncs)} synchronisations in {rounds} rounds"


@pytest.mark.parametrize("name", ["target-only", "draft-lm", "eagle3-chain-graphed"])
def test_graphed_batches_equal_eager_target_only(target_on_gpu, name):
    """Four prompts at once on the static batch cache, each (rows, width) forward a graph."""
    target, tokenizer, prompts = target_on_gpu
    params = SamplingParams(max_new_tokens=64)
    eager = SpeculativeGenerator(target, tokenizer)
    expected = [eager.generate(prompt, params).token_ids for prompt in prompts]
    proposer = _proposers(target, tokenizer)[name]
    factories = {
        "target-only": None,
        "draft-lm": lambda: DraftModelProposer(proposer.model, cache=CacheSettings(static=True)),
        "eagle3-chain-graphed": lambda: EagleProposer(
            proposer.drafter, cache=CacheSettings(static=True)
        ),
    }
    batch = BatchGenerator(target, tokenizer, factories[name], 4, cache=CacheSettings(static=True))
    out = batch.generate(prompts, params)
    assert [o.token_ids for o in out.outputs] == expected, name
    assert batch._static.use_graphs and batch._static._shapes


def _zoo_names() -> list[str]:
    """The published testbed-small drafters, read from the zoo's index."""
    import json

    index = json.loads((builtin_zoo_dir() / "index.json").read_text())
    return sorted(name for name in index["drafters"] if name.endswith("-testbed-small"))


@pytest.mark.parametrize("proposal", [None, "hybrid"])
@pytest.mark.parametrize("name", _zoo_names())
def test_every_published_drafter_graphed_equals_eager_target_only(name, proposal):
    """`draftzoo.load(name, device="cuda", cache=static)` as a user serves it: graphed greedy
    output equals eager target-only decoding of the generator's own target (Medusa-2's is the
    target with its LoRA adapter merged)."""
    import draftzoo

    generator = draftzoo.load(
        name, proposal=proposal, device="cuda", cache=CacheSettings(static=True)
    )
    tokenizer = generator.tokenizer
    prompts = [p.render(tokenizer, chat=True) for p in load_prompt_set("humaneval")[:3]]
    params = SamplingParams(max_new_tokens=48)
    eager = SpeculativeGenerator(generator.target, tokenizer)
    for prompt in prompts:
        expected = eager.generate(prompt, params).token_ids
        assert generator.generate(prompt, params).token_ids == expected, (name, proposal)
    assert generator.forward.use_graphs and generator.forward._shapes, name
