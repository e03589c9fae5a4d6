"""The zoo shipped with draftzoo: every entry is whole, measured, and loads back to its numbers."""

from __future__ import annotations

import hashlib
import json

import pytest

import draftzoo
from draftzoo.architectures.defaults import COMMITTED_TARGET, fetched_target_dir
from draftzoo.architectures.drafter_io import checkpoint_hash
from draftzoo.architectures.zoo_index import ZooIndex, builtin_zoo_dir
from draftzoo.data.prompts import load_prompt_set
from draftzoo.inference.cache_settings import CacheSettings
from draftzoo.inference.proposal_settings import from_name
from draftzoo.inference.sampling import SamplingParams

ENTRIES = ZooIndex(builtin_zoo_dir()).entries()
ZOO_BYTES = 250 * 2**20  # the shipped zoo's distinct contents (a clone stores shared files once)
FILE_BYTES = 50 * 2**20


def target_here(entry: dict) -> bool:
    """Whether the entry's target is on this machine: `testbed-small` ships with draftzoo, a
    fetchable target (SmolLM2) once `draftzoo target get` made it (tests never fetch)."""
    base = entry["base_model"]
    return base == COMMITTED_TARGET or fetched_target_dir(base) is not None


def test_the_shipped_zoo_lists_every_family_for_each_target():
    from draftzoo.architectures.families import family_specs

    targets = {e["base_model"] for e in ENTRIES.values()}
    assert COMMITTED_TARGET in targets
    for target in targets:
        families = {e["family"] for e in ENTRIES.values() if e["base_model"] == target}
        assert families == set(family_specs()), target


def test_the_shipped_zoo_stays_lean():
    """bf16 weights, no file over 50 MB, the distinct contents within 250 MB."""
    from safetensors import safe_open

    distinct: dict[str, int] = {}
    for name in ENTRIES:
        for file in ZooIndex(builtin_zoo_dir()).folder(name).rglob("*"):
            if not file.is_file():
                continue
            assert file.stat().st_size <= FILE_BYTES, file
            distinct[hashlib.sha256(file.read_bytes()).hexdigest()] = file.stat().st_size
            if file.suffix == ".safetensors":
                with safe_open(file, "pt") as weights:
                    names = weights.keys()
                    floats = {weights.get_slice(k).get_dtype() for k in names}
                assert floats - {"BOOL", "I64"} == {"BF16"}, file
    assert sum(distinct.values()) <= ZOO_BYTES


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_entry_is_whole_measured_and_certified(name):
    entry = ENTRIES[name]
    folder = ZooIndex(builtin_zoo_dir()).folder(name)
    assert checkpoint_hash(folder) == entry["checkpoint_hash"]
    report = json.loads((folder / "report.json").read_text())
    assert report["checkpoint"]["sha256"] == entry["checkpoint_hash"]
    card = (folder / "README.md").read_text()
    assert card.startswith("---\n") and name in card
    # every shipped drafter carries its passed losslessness certificate, on the card too
    assert report["certificate"]["passed"] and entry["certificate"]["passed"]
    assert report["certificate"]["config"]["samples"] >= 4000
    assert "## Losslessness certificate" in card and "certificate PASSED" in card
    assert "**Budget**: " in card
    # what its training cost: recorded by the training, or by a rerun of its recipe that the
    # card names (bench/cost_rerun.py)
    assert "supervised_tokens_per_second" in card and "peak_memory_mb" in card
    assert "bytes per token" in card  # the capture's storage
    for result in report["results"]:
        if result["temperature"] == 0:
            assert result["greedy_identity"]["rate"] == 1.0, result["batch_size"]


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_entry_loads_back_to_its_card(name):
    entry = ENTRIES[name]
    if not target_here(entry):
        pytest.skip(f"{entry['base_model']} is not fetched (`draftzoo target get`)")
    report = json.loads((ZooIndex(builtin_zoo_dir()).folder(name) / "report.json").read_text())
    generator = draftzoo.load(name)
    if report["serving"].get("hybrid_rule", {}).get("pace"):
        return hybrid_keeps_the_target_output(generator, report)
    greedy = next(r for r in report["results"] if r["temperature"] == 0 and r["batch_size"] == 1)
    prompts = {p.prompt_id: p for p in load_prompt_set("humaneval")}
    rows = [row for row in greedy["per_prompt"] if row["id"] in prompts][:2]
    tokens = forwards = 0
    for row in rows:
        text = prompts[row["id"]].render(generator.tokenizer, chat=report["config"]["chat"])
        params = SamplingParams(max_new_tokens=report["config"]["max_new_tokens"])
        out = generator.generate(text, params)
        tokens += len(out.token_ids)
        forwards += out.metrics.num_target_forwards
    card_tau = sum(r["tokens"] for r in rows) / sum(r["forwards"] for r in rows)
    # greedy decoding repeats itself on the same machine; allow for another CPU's float order
    assert tokens / forwards == pytest.approx(card_tau, rel=0.1)


def hybrid_keeps_the_target_output(generator, report) -> None:
    """A hybrid whose rule weighs paces drafts as this machine's timings say, so its tau is
    not the card's: its greedy output is the target's own, whole, and it still speculates."""
    from draftzoo.inference.generate import SpeculativeGenerator

    text = load_prompt_set("humaneval")[0].render(generator.tokenizer, report["config"]["chat"])
    params = SamplingParams(max_new_tokens=48)
    plain = SpeculativeGenerator(generator.target, generator.tokenizer).generate(text, params)
    out = generator.generate(text, params)
    assert out.token_ids == plain.token_ids and len(plain.token_ids) > 0
    assert out.metrics.num_target_forwards < plain.metrics.num_target_forwards


def test_published_draft_lm_serves_as_transformers_assistant(tmp_path):
    """The shipped draft LM, exported as a plain checkpoint, is accepted by transformers'
    assisted generation and keeps the target's greedy output."""
    import torch
    from transformers import AutoModelForCausalLM

    from draftzoo.architectures.export import export_drafter
    from draftzoo.inference.load import load_target

    folder = ZooIndex(builtin_zoo_dir()).folder("draft-lm-testbed-small")
    draft = AutoModelForCausalLM.from_pretrained(export_drafter(folder, tmp_path / "hf", "hf"))
    target, tokenizer = load_target("testbed-small")
    text = load_prompt_set("humaneval")[0].render(tokenizer, chat=True)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    plain = target.generate(ids, max_new_tokens=48, do_sample=False)
    assisted = target.generate(ids, max_new_tokens=48, do_sample=False, assistant_model=draft)
    assert torch.equal(plain, assisted)


@pytest.mark.parametrize("name", ["draft-lm-testbed-small", "eagle3-testbed-small"])
def test_load_with_static_caches_gives_the_same_tokens(name):
    """The target's cache and the drafter's (a draft LM, an EAGLE chain) preallocated."""
    prompt = load_prompt_set("humaneval")[0]
    plain = draftzoo.load(name, proposal="chain")
    cache = CacheSettings(static=True, max_length=1024)
    static = draftzoo.load(name, proposal="chain", cache=cache)
    assert static.max_cache_length == 1024
    text = prompt.render(plain.tokenizer, chat=True)
    params = SamplingParams(max_new_tokens=48)
    fast, slow = static.generate(text, params), plain.generate(text, params)
    assert fast.token_ids == slow.token_ids
    assert fast.metrics.num_target_forwards == slow.metrics.num_target_forwards
    # both caches preallocated for 1024 positions hold more than the grown ones
    assert fast.metrics.peak_cache_bytes > 2 * slow.metrics.peak_cache_bytes


def test_load_serves_the_published_length_fixed_or_adaptive():
    from draftzoo.inference.speculation_length import AdaptiveLength

    entry = ENTRIES["eagle1-testbed-small"]
    published = entry["serving"]["num_speculative_tokens"]
    assert draftzoo.load("eagle1-testbed-small").speculation == published
    assert draftzoo.load("eagle1-testbed-small", num_speculative_tokens=2).speculation == 2
    adaptive = draftzoo.load("eagle1-testbed-small", num_speculative_tokens=None)
    assert isinstance(adaptive.speculation, AdaptiveLength)
    params = SamplingParams(max_new_tokens=24)
    fixed = draftzoo.load("eagle1-testbed-small").generate("def add(a, b):", params)
    out = adaptive.generate("def add(a, b):", params)
    assert out.token_ids == fixed.token_ids  # lossless either way
    assert out.metrics.num_accepted_tokens > 0  # and the adaptive length did draft
    with pytest.raises(draftzoo.DraftzooError, match="num_speculative_tokens"):
        draftzoo.load("eagle1-testbed-small", num_speculative_tokens=0)


def test_a_drafter_whose_record_names_no_target_needs_one(tmp_path):
    import shutil

    from draftzoo.architectures.drafter_io import DrafterError
    from draftzoo.inference.load import load_target

    folder = tmp_path / "drafter"
    shutil.copytree(ZooIndex(builtin_zoo_dir()).folder("eagle1-testbed-small"), folder)
    record_file = folder / "draftzoo.json"
    record = json.loads(record_file.read_text())
    del record["recipe"]["target"]
    record_file.write_text(json.dumps(record))
    with pytest.raises(DrafterError, match="names no target"):
        draftzoo.load(folder)
    target, tokenizer = load_target("testbed-small")
    generator = draftzoo.load(folder, target, tokenizer)
    assert generator.generate("def f(x):", SamplingParams(max_new_tokens=4)).token_ids


def test_a_draft_lm_shipping_pickled_weights_is_refused(tmp_path):
    """A stranger's draft-LM folder whose weights are a pickle (pytorch_model.bin) is refused
    before anything is unpickled; the same folder with safetensors loads."""
    import shutil

    import torch
    from safetensors.torch import load_file

    from draftzoo.architectures.drafter_io import DrafterError
    from draftzoo.inference.load import load_drafter, load_target

    folder = tmp_path / "draft"
    shutil.copytree(ZooIndex(builtin_zoo_dir()).folder("draft-lm-testbed-small"), folder)
    model, tokenizer = load_target("testbed-small")
    assert load_drafter(folder, model, tokenizer, from_name("chain", 3)).family == "draft_lm"
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    with pytest.raises(DrafterError, match="safetensors and JSON only"):
        load_drafter(folder, model, tokenizer, from_name("chain", 3))
