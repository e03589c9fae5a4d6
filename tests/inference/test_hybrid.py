"""Hybrid proposals: suffix branches merged into a drafter's tree (shared prefixes followed,
one-hot q appended), the rule's choices (by scores and by measured paces), greedy identity,
exact sampling with both branch kinds in one tree, loading and its refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.hybrid import (
    Calibration,
    Delivery,
    HybridProposer,
    HybridSettings,
    Pace,
    accepted_nodes,
    merge,
)
from draftzoo.inference.load import load_drafter
from draftzoo.inference.proposers import PromptLookupProposer, ProposerError
from draftzoo.inference.sampling import SamplingParams
from draftzoo.inference.suffix import Speculation, SuffixCache, SuffixSettings
from draftzoo.inference.tree import Proposal
from tests.inference.helpers import PROMPTS
from tests.inference.test_lossless_sampling import (
    PARAMS,
    _eagle3,
    _exact_distribution,
    _threshold,
    _tiny_lm,
    _tv,
    sample_outcomes,
)


def test_merge_follows_shared_prefixes_and_appends_one_hot_branches():
    q = torch.softmax(torch.randn(3, 6), -1)
    drafter = Proposal([2, 3, 4], [-1, 0, -1], q)  # 2 -> 3, and 4
    found = Speculation([2, 5, 1], [-1, 0, 1], 1.5, 3)  # 2 -> 5 -> 1
    merged, mine = merge(drafter, found)
    assert merged.tokens == [2, 3, 4, 5, 1] and merged.parents == [-1, 0, -1, 0, 3]
    assert mine == [True, True, True, False, False]
    assert torch.equal(merged.draft_probs[:3], q)
    assert merged.draft_probs[3].tolist() == [0, 0, 0, 0, 0, 1.0]
    assert merged.draft_probs[4].argmax() == 1 and merged.draft_probs[4].sum() == 1
    assert accepted_nodes(merged, [2, 5, 1, 0]) == [0, 3, 4]
    # a suffix branch the drafter already proposed adds no node (sampling: no one-hot row)
    merged, mine = merge(drafter, Speculation([2, 3], [-1, 0], 2.0, 2))
    assert merged.tokens == [2, 3, 4] and mine == [True] * 3
    assert torch.equal(merged.draft_probs, q)


def test_greedy_output_equals_target_only_and_the_rule_uses_each_choice(
    tiny_drafters, target_and_tokenizer, reference
):
    model, tokenizer = target_and_tokenizer
    runtime = load_drafter(tiny_drafters["eagle3"], model, tokenizer, "hybrid-tree", 3)
    assert runtime.proposal == "hybrid-tree"
    proposer = runtime.make_proposer()
    generator = SpeculativeGenerator(model, tokenizer, proposer, runtime.num_speculative_tokens)
    params = SamplingParams(max_new_tokens=32)
    for _ in range(2):  # the second pass finds the first pass's answers in the global cache
        assert [generator.generate(p, params).token_ids for p in PROMPTS] == reference
    # this barely trained drafter delivers ~nothing, so a suffix match drafts alone
    assert proposer.choices["suffix"] > 0 and proposer.choices["drafter"] > 0, proposer.choices
    assert proposer.suffix.cache.tokens > 0
    runtime.begin_pass()
    assert proposer.suffix.cache.tokens == 0
    # suffix branches beside the drafter's in every round they score
    settings = HybridSettings(alone_margin=1e9, min_score=0.0, pace=False)
    both = HybridProposer(proposer.drafter, settings, SuffixCache())
    generator = SpeculativeGenerator(model, tokenizer, both, runtime.num_speculative_tokens)
    assert [generator.generate(p, params).token_ids for p in PROMPTS] == reference
    assert both.choices["both"] > 0 and "suffix" not in both.choices


def _calibrated(calibration: Calibration) -> HybridProposer:
    """Prompt lookup (the drafter) and a global suffix cache that has seen 1 2 3 4 5, every
    measurement kept from the last round only (decay 0), `calibration` at T = 0."""
    cache = SuffixCache(8)
    cache.add([1, 2, 3, 4, 5])
    settings = HybridSettings(SuffixSettings(depth=8, max_draft=4, spec_factor=4), decay=0.0)
    proposer = HybridProposer(PromptLookupProposer(), settings, cache)
    proposer.calibrations[0.0] = calibration
    return proposer


def test_the_rule_calibrates_suffix_scores_by_what_they_delivered_per_temperature():
    greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=0)
    # the drafter delivers 0.5 a round; the counts promise 3 after "1 2": suffix alone
    proposer = _calibrated(Calibration(drafter=Delivery(0.5, 1.0)))
    assert proposer.propose([9, 1, 2], 4, greedy, None).tokens == [3, 4, 5]
    assert proposer.choices == {"suffix": 1}
    proposer.propose([9, 1, 2, 3, 4, 8], 4, greedy, None)  # 3 4 accepted, 8 the target's
    measured = proposer.calibrations[0.0]
    assert (measured.alone.delivered, measured.alone.promised) == (2, 3.0)
    assert measured.alone.calibrate(3.0) == 2.0
    # suffix-alone rounds measured at nothing: the same match joins the drafter's instead
    proposer = _calibrated(Calibration(drafter=Delivery(0.5, 1.0), alone=Delivery(0.0, 3.0)))
    merged = proposer.propose([9, 1, 2], 4, greedy, None)
    assert proposer.choices == {"both": 1} and merged.tokens == [3, 4, 5]
    proposer.propose([9, 1, 2, 3, 8], 4, greedy, None)  # the suffix node 3 accepted
    measured = proposer.calibrations[0.0]
    assert (measured.both.delivered, measured.both.promised) == (1, 3.0)
    assert (measured.drafter.delivered, measured.drafter.promised) == (0, 1.0)
    # "both" rounds measured at nothing: the drafter alone
    proposer = _calibrated(Calibration(drafter=Delivery(9.0, 1.0), both=Delivery(0.0, 3.0)))
    proposer.propose([9, 1, 2], 4, greedy, None)
    assert proposer.choices == {"drafter": 1}
    # another temperature starts unmeasured: nothing is taken from T = 0's rounds
    proposer = _calibrated(Calibration(drafter=Delivery(0.0, 1.0)))
    proposer.propose([9, 1, 2], 4, sampled, torch.Generator().manual_seed(0))
    assert proposer.choices == {"both": 1} and set(proposer.calibrations) == {0.0, 1.0}


def paces_slow() -> dict[str, Pace]:
    """The drafter's rounds at 1.5 tokens/s, plain steps at 2."""
    return dict(drafting=Pace(1.0, 1.5), plain=Pace(0.5, 1.0))


def test_the_rule_drafts_nothing_or_suffix_alone_while_the_drafter_does_not_pay():
    greedy = SamplingParams(temperature=0.0)

    def slow(alone: float = 1.0, **paces) -> Calibration:
        """The drafter delivers 2 a round; the counts' 3 after "1 2" calibrate to `alone`:
        below it, and below the score for "both" (0.5) when `alone` is."""
        return Calibration(Delivery(2.0, 1.0), Delivery(alone, 3.0), **paces)

    # unmeasured: the drafter first, then a plain step, then whichever is faster
    proposer = _calibrated(slow())
    proposer.propose([9, 1, 2], 4, greedy, None)
    assert proposer.choices == {"both": 1}
    assert proposer.propose([9, 1, 2, 3, 7], 4, greedy, None).tokens == []
    assert proposer.choices == {"both": 1, "none": 1}
    proposer.propose([9, 1, 2, 3, 7, 6], 4, greedy, None)
    measured = proposer.calibrations[0.0]
    assert measured.drafting.tokens == 2 and measured.plain.tokens == 1
    assert measured.drafting.seconds > 0 and measured.plain.seconds > 0
    # plain steps at 2 tokens/s, the drafter's rounds at 1.5: suffix alone where it matches
    # with a calibrated score of 0.5 or more, else nothing; the drafter again on a probe round
    paces = dict(drafting=Pace(1.0, 1.5), plain=Pace(0.5, 1.0))
    proposer = _calibrated(slow(**paces))
    assert proposer.propose([9, 1, 2], 4, greedy, None).tokens == [3, 4, 5]
    assert proposer.propose([9, 1, 2, 3, 8], 4, greedy, None).tokens == []  # no match
    assert proposer.choices == {"suffix": 1, "none": 1}
    proposer = _calibrated(slow(alone=0.3, **paces))
    assert proposer.propose([9, 1, 2], 4, greedy, None).tokens == []  # a match scoring 0.3
    assert proposer.choices == {"none": 1}
    proposer = _calibrated(slow(**paces, rounds=31))  # round 32: a probe
    proposer.propose([9, 1, 2], 4, greedy, None)
    assert proposer.choices == {"both": 1}
    # the drafter's rounds at 3 tokens/s: it drafts; a plain step on a probe round
    paces = dict(drafting=Pace(1.0, 3.0), plain=Pace(0.5, 1.0))
    proposer = _calibrated(slow(**paces))
    proposer.propose([9, 1, 2], 4, greedy, None)
    assert proposer.choices == {"both": 1}
    proposer = _calibrated(slow(**paces, rounds=31))
    assert proposer.propose([9, 1, 2], 4, greedy, None).tokens == []
    assert proposer.choices == {"none": 1}

    # time_widths: a suffix-alone round of 3 nodes timed goes alone only where its pace
    # beats plain steps'
    def timed(calibration: Calibration) -> HybridProposer:
        proposer = _calibrated(calibration)
        proposer.settings = replace(proposer.settings, time_widths=True)
        return proposer

    three_slow = {3: Pace(2.0, 2.0)}
    proposer = timed(slow(**paces_slow(), alone_paces=three_slow))
    assert proposer.propose([9, 1, 2], 4, greedy, None).tokens == []  # (1 + 1) / 2 s < 2/s
    proposer = _calibrated(slow(**paces_slow(), alone_paces=three_slow))  # by min_score
    assert proposer.propose([9, 1, 2], 4, greedy, None).tokens == [3, 4, 5]
    proposer = timed(slow(alone=0.3, **paces_slow(), alone_paces={3: Pace(0.5, 1.0)}))
    assert proposer.propose([9, 1, 2], 4, greedy, None).tokens == [3, 4, 5]  # 1.3 / 0.5 s
    proposer.propose([9, 1, 2, 3, 4, 5, 6], 4, greedy, None)  # all 3 accepted: timed again
    measured = proposer.calibrations[0.0].alone_paces[3]
    assert measured.tokens == 4 and 0 < measured.seconds < 0.5
    retried = timed(slow(**paces_slow(), alone_paces=three_slow, rounds=15))  # round 16
    assert retried.propose([9, 1, 2], 4, greedy, None).tokens == [3, 4, 5]
    # pace=False: by scores alone
    proposer = _calibrated(slow(drafting=Pace(1.0, 1.5), plain=Pace(0.5, 1.0)))
    proposer.settings = HybridSettings(proposer.settings.suffix, decay=0.0, pace=False)
    proposer.propose([9, 1, 2], 4, greedy, None)
    assert proposer.choices == {"both": 1}


def test_plain_steps_and_suffix_rounds_instead_of_a_slow_drafter_keep_greedy_identity(
    tiny_drafters, target_and_tokenizer, reference
):
    model, tokenizer = target_and_tokenizer
    runtime = load_drafter(tiny_drafters["eagle3"], model, tokenizer, "hybrid-tree", 3)
    # the drafter measured (and, with decay 0.99, kept) far slower than plain steps
    settings = HybridSettings(SuffixSettings(tree=True), decay=0.99)
    proposer = HybridProposer(runtime.make_proposer().drafter, settings, SuffixCache())
    slow = Calibration(drafting=Pace(100.0, 1.0), plain=Pace(1e-3, 1.0))
    proposer.calibrations[0.0] = slow
    generator = SpeculativeGenerator(model, tokenizer, proposer, runtime.num_speculative_tokens)
    params = SamplingParams(max_new_tokens=32)
    for _ in range(2):  # the second pass drafts from the global cache
        assert [generator.generate(p, params).token_ids for p in PROMPTS] == reference
    assert proposer.choices["none"] > 0 and proposer.choices["suffix"] > 0, proposer.choices
    rounds = sum(proposer.choices.values())
    assert 0 < proposer.choices["drafter"] + proposer.choices["both"] <= rounds // 32 + 1


@pytest.mark.parametrize("tree", [False, True], ids=["eagle3-chain", "eagle3-tree"])
def test_sampling_with_both_branch_kinds_matches_the_target_distribution(tree):
    """An untrained EAGLE-3 drafter's sampled chain or tree (its q far from p) with suffix
    branches merged in (one-hot q), every round: the TV test of test_lossless_sampling.py."""
    target = _tiny_lm(seed=0, sharpness=30.0)
    exact = _exact_distribution(target, PARAMS)
    cache = SuffixCache(4)
    for output in ([1, 4, 2, 3, 0], [4, 2, 5, 1], [4, 3, 3, 2], [2, 2, 4, 1]):
        cache.add(output)
    # min_score 0 and an unreachable alone margin: suffix branches join the drafter's always
    settings = HybridSettings(
        SuffixSettings(depth=4, max_draft=2, tree=True, min_token_prob=0.0, spec_factor=4),
        alone_margin=1e9,
        min_score=0.0,
        pace=False,
    )
    proposer = HybridProposer(_eagle3(target, tree), settings, cache)
    generator = SpeculativeGenerator(target, None, proposer, num_speculative_tokens=3)
    counts, accepted = sample_outcomes(generator)
    tv, threshold = _tv(counts, exact), _threshold(exact)
    assert tv < threshold, f"TV {tv:.4f} >= {threshold:.4f}"
    assert accepted > 0 and proposer.choices["both"] > 0


def test_hybrid_chains_serve_any_family_and_hybrid_trees_need_a_tree_family(
    tiny_drafters, target_and_tokenizer, reference, capsys
):
    model, tokenizer = target_and_tokenizer
    runtime = load_drafter(tiny_drafters["draft_lm"], model, tokenizer, "hybrid", 3)
    generator = SpeculativeGenerator(model, tokenizer, runtime.make_proposer(), 3)
    params = SamplingParams(max_new_tokens=32)
    assert [generator.generate(p, params).token_ids for p in PROMPTS] == reference
    with pytest.raises(ProposerError, match="drafts chains only; hybrid trees"):
        load_drafter(tiny_drafters["draft_lm"], model, tokenizer, "hybrid-tree", 3)
    from draftzoo.cli import main

    drafter = str(tiny_drafters["draft_lm"])
    assert main(["generate", "--drafter", drafter, "--hybrid", "--tree", "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("draftzoo: error: ") and "drafts chains only; hybrid trees" in err[-1]
    assert main(["generate", "--hybrid", "--prompt", "x"]) == 2
    assert capsys.readouterr().err.strip() == (
        "draftzoo: error: --hybrid needs --drafter DRAFTER (suffix branches beside its drafts)"
    )


def test_a_hybrid_keeps_its_global_cache_in_a_file_across_processes(
    tiny_drafters, testbed_tiny, tmp_path, capsys
):
    """`generate --hybrid --suffix-cache FILE`: each run is a new process's generator; the
    second run of a prompt starts from the first's output."""
    import json

    from draftzoo.cli import main

    cache = tmp_path / "suffix.json"
    args = ["generate", "--target", str(testbed_tiny[0]), "--drafter"]
    args += [str(tiny_drafters["draft_lm"]), "--hybrid", "--suffix-cache", str(cache)]
    args += ["--prompt", PROMPTS[0], "--max-new-tokens", "24"]
    assert main(args) == 0
    first = capsys.readouterr().out
    held = json.loads(cache.read_text())["outputs"]
    assert len(held) == 1 and len(held[0]) > 0
    assert main(args) == 0
    second = capsys.readouterr().out
    assert second.split("--- finish")[0] == first.split("--- finish")[0]  # the same text
    assert len(json.loads(cache.read_text())["outputs"]) == 2

    def forwards(out: str) -> int:
        line = next(x for x in out.splitlines() if "num_target_forwards" in x)
        return int(line.split(":")[-1])

    assert forwards(second) < forwards(first)  # drafted from the first run's output


def test_bad_hybrid_settings_are_refused():
    from draftzoo.inference.errors import GenerationError

    with pytest.raises(GenerationError, match="alone_margin must be > 0"):
        HybridSettings(alone_margin=0)
    with pytest.raises(GenerationError, match="decay"):
        HybridSettings(decay=1.0)
    with pytest.raises(GenerationError, match="probe_every must be >= 2"):
        HybridSettings(probe_every=1)
    assert HybridProposer(PromptLookupProposer()).target_layers == ()


def test_an_eval_of_a_hybrid_reports_its_rounds_by_the_rules_choice(
    tiny_drafters, tiny_target_model, tmp_path
):
    from draftzoo.eval.model_card import eval_command, render_card
    from draftzoo.eval.runner import EvalConfig, evaluate

    model, tokenizer, path = tiny_target_model
    drafter = load_drafter(tiny_drafters["eagle3"], model, tokenizer, "hybrid-tree", 3)
    config = EvalConfig(
        max_prompts=3,
        max_new_tokens=24,
        proposal="hybrid-tree",
        certificate_samples=0,
    )
    report = evaluate(model, tokenizer, drafter, config, str(path), show_progress=False)
    assert report["serving"]["hybrid_rule"] == HybridSettings().rule()
    assert report["serving"]["hybrid_rule"]["pace"] is True
    for row in report["results"]:
        rounds = row["hybrid_rounds"]
        assert set(rounds) <= {"suffix", "both", "drafter", "none"} and sum(rounds.values()) > 0
        # every round the rule chose was one verification forward (warm-up prompt included)
        assert sum(rounds.values()) >= row["per_prompt"][0]["forwards"]
    # a card reproduces it as a hybrid tree and says what its rule weighs
    command = eval_command(report, "D")
    assert "--hybrid" in command and "--tree" in command
    record = {"family": "eagle3", "hidden_state_layers": [1, 1, 1]}
    card = render_card("d", record, report, [], "draftzoo train R")
    assert "measured pace of its rounds against plain steps" in card


def test_the_rule_by_scores_alone_is_asked_for_by_name_and_fixes_a_seeded_sample(
    tiny_drafters, target_and_tokenizer, capsys
):
    import draftzoo
    from draftzoo.cli import main

    model, tokenizer = target_and_tokenizer
    folder = tiny_drafters["eagle3"]
    by_scores = draftzoo.HybridSettings(pace=False)
    params = SamplingParams(temperature=1.0, seed=0, max_new_tokens=24)
    outputs = []
    for _ in range(2):  # two generators, as two processes would build them (fixed length)
        generator = draftzoo.load(folder, model, tokenizer, proposal="hybrid", hybrid=by_scores)
        assert generator.proposer.settings.pace is False
        outputs.append(generator.generate(PROMPTS[0], params).token_ids)
    assert outputs[0] == outputs[1]
    with pytest.raises(ProposerError, match="hybrid settings are a hybrid proposal's"):
        load_drafter(folder, model, tokenizer, "chain", 3, hybrid=by_scores)
    assert main(["generate", "--drafter", str(folder), "--hybrid-by-scores", "--prompt", "x"]) == 2
    assert capsys.readouterr().err.strip() == (
        "draftzoo: error: --hybrid-by-scores sets the rule of --hybrid: use it with --hybrid"
    )


def test_a_zoo_entry_served_as_a_hybrid_loads_with_the_rule_it_was_measured_with(tmp_path):
    """`draftzoo.load(name)` serves the hybrid rule the entry's evaluation recorded, not
    whatever the default rule is now; another proposal takes no rule."""
    import json
    import shutil

    import draftzoo
    from draftzoo.architectures.zoo_index import ZooIndex, builtin_zoo_dir

    name = "eagle3-testbed-small"
    entry = ZooIndex(builtin_zoo_dir()).entries()[name]
    shutil.copytree(ZooIndex(builtin_zoo_dir()).folder(name), tmp_path / name)
    recorded = dict(HybridSettings().rule(), pace=False, probe_every=8)
    entry["serving"] = dict(entry["serving"], proposal="hybrid", hybrid_rule=recorded)
    index = {"version": 1, "drafters": {name: entry}}
    (tmp_path / "index.json").write_text(json.dumps(index))
    generator = draftzoo.load(name, zoos=[tmp_path])
    assert generator.proposer.settings.rule() == recorded
    assert not hasattr(draftzoo.load(name, zoos=[tmp_path], proposal="chain").proposer, "settings")
    entry["serving"]["hybrid_rule"] = dict(recorded, probe_every=1)  # not a rule: one line
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(draftzoo.DraftzooError, match=r"serving\.hybrid_rule .* is not a rule"):
        draftzoo.load(name, zoos=[tmp_path])
