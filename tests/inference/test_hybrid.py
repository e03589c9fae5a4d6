"""Hybrid proposals: model-free branches merged into a drafter's tree (shared prefixes
followed, one-hot q appended), the rule's choices (by measured paces, and without a clock) and
its measurements, greedy identity, exact sampling with both branch kinds in one tree, loading
and its refusals."""

from __future__ import annotations

import pytest
import torch

from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.load import load_drafter
from draftzoo.inference.proposal_settings import from_name
from draftzoo.inference.proposer import ProposerError
from draftzoo.inference.proposers.hybrid import (
    HybridProposer,
    HybridSettings,
    accepted_nodes,
    merge,
)
from draftzoo.inference.proposers.hybrid_rule import (
    CHOICES,
    Calibration,
    Candidate,
    Choice,
    Mean,
    choose,
)
from draftzoo.inference.proposers.prompt_lookup import PromptLookupProposer
from draftzoo.inference.proposers.suffix import SuffixCache, SuffixSettings
from draftzoo.inference.sampling import SamplingParams
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
    found = Candidate("suffix", Proposal([2, 5, 1], [-1, 0, 1]), 3)  # 2 -> 5 -> 1
    merged, mine = merge(drafter, found)
    assert merged.tokens == [2, 3, 4, 5, 1] and merged.parents == [-1, 0, -1, 0, 3]
    assert mine == [True, True, True, False, False]
    assert torch.equal(merged.draft_probs[:3], q)
    assert merged.draft_probs[3].tolist() == [0, 0, 0, 0, 0, 1.0]
    assert merged.draft_probs[4].argmax() == 1 and merged.draft_probs[4].sum() == 1
    assert accepted_nodes(merged, [2, 5, 1, 0]) == [0, 3, 4]
    # a suffix branch the drafter already proposed adds no node (sampling: no one-hot row)
    merged, mine = merge(drafter, Candidate("lookup", Proposal.chain([2, 3]), 2))
    assert merged.tokens == [2, 3, 4] and mine == [True] * 3
    assert torch.equal(merged.draft_probs, q)


def test_greedy_output_equals_target_only_and_the_rule_uses_each_choice(
    tiny_drafters, target_and_tokenizer, reference
):
    model, tokenizer = target_and_tokenizer
    runtime = load_drafter(tiny_drafters["eagle3"], model, tokenizer, from_name("hybrid-tree", 3))
    assert runtime.settings.kind == "hybrid-tree"
    proposer = runtime.make_proposer()
    generator = SpeculativeGenerator(model, tokenizer, proposer, runtime.num_speculative_tokens)
    params = SamplingParams(max_new_tokens=32)
    for _ in range(2):  # the second pass finds the first pass's answers in the global cache
        assert [generator.generate(p, params).token_ids for p in PROMPTS] == reference
    # this barely trained drafter delivers ~nothing, so model-free candidates draft alone
    alone = proposer.choices["suffix"] + proposer.choices["lookup"]
    assert alone > 0 and proposer.choices["drafter"] > 0, proposer.choices
    assert proposer.suffix.cache.tokens > 0
    runtime.begin_pass()
    assert proposer.suffix.cache.tokens == 0
    # model-free branches beside the drafter's in every round that has one
    settings = HybridSettings(alone_margin=1e9, min_score=0.0, pace=False)
    both = HybridProposer(proposer.drafter, settings, SuffixCache())
    generator = SpeculativeGenerator(model, tokenizer, both, runtime.num_speculative_tokens)
    assert [generator.generate(p, params).token_ids for p in PROMPTS] == reference
    assert both.choices["both"] > 0 and "suffix" not in both.choices


class _Fixed(PromptLookupProposer):
    """A drafter that always proposes the chain `tokens` (counting its calls)."""

    def __init__(self, tokens: list[int]) -> None:
        super().__init__()
        self.tokens, self.calls = tokens, 0

    def propose(self, context, max_tokens, params, generator) -> Proposal:
        self.calls += 1
        return Proposal.chain(self.tokens[:max_tokens])


def _measured(**fields) -> Calibration:
    """A calibration whose drafter and plain steps were measured this round (no probe due)."""
    return Calibration(
        drafter=Mean(fields.pop("drafter", 0.5)), last={"drafter": 0, "none": 0}, **fields
    )


def _lookup(bucket: int = 2, width: int = 4) -> Candidate:
    return Candidate("lookup", Proposal.chain(list(range(width))), bucket)


def test_the_rule_takes_the_most_tokens_per_second_and_probes_what_it_does_not_choose():
    plain = {(False, 0): Mean(1.0), (True, 4): Mean(2.0)}  # a plain step 1 s, a drafted round 2
    candidate = _lookup()

    def choice(calibration: Calibration, candidates=(candidate,), pace=True) -> Choice:
        return choose(calibration, list(candidates), HybridSettings(pace=pace, switch_margin=0))

    # untimed widths cost what the nearest timed width costs: 4 nodes as a plain step
    measured = _measured(yields={candidate.key: Mean(0.2)}, seconds=dict(plain), drafter_width=4)
    assert choice(measured) == Choice("lookup", candidate)  # 1.2 / 1 s against 1 / 1 s
    # timed at 1.5 s, 4 nodes of lookup no longer pay (1.2 / 1.5 s): a plain step
    measured.seconds[(False, 4)] = Mean(1.5)
    assert choice(measured) == Choice("none")
    measured.yields[candidate.key] = Mean(1.0)  # 2 / 1.5 s
    assert choice(measured).kind == "lookup"
    # a drafter delivering 3 a round (4 tokens in 2 s) beats both
    measured.drafter = Mean(3.0)
    assert choice(measured) == Choice("drafter")
    measured.gains[candidate.key] = Mean(1.0)  # merging it added 1 a round: 5 in 2 s
    assert choice(measured) == Choice("both", candidate)
    # unmeasured candidates yield nothing yet; without candidates, the drafter or nothing
    assert choice(_measured(seconds=dict(plain), drafter=0.0)) == Choice("none")
    # probes: the drafter first, a plain step next, each again after 32 rounds without it
    assert choice(Calibration(seconds=dict(plain))) == Choice("drafter")
    assert choice(_measured(seconds={(True, 4): Mean(2.0)})) == Choice("none")
    stale = _measured(seconds=dict(plain), drafter=0.0, rounds=32)
    assert choice(stale) == Choice("drafter")
    stale.last["drafter"] = 32
    assert choice(stale) == Choice("none")
    # a round changes between drafting and not only for switch_margin more
    level = _measured(yields={candidate.key: Mean(1.0)}, seconds=dict(plain), drafter_width=4)
    level.drafter, level.drafted = Mean(2.8), True  # 3.8 / 2 s against the lookup's 2 / 1 s
    margin = HybridSettings(switch_margin=0.1)
    assert choose(level, [candidate], margin) == Choice("drafter")
    level.drafted = False
    assert choose(level, [candidate], margin) == Choice("lookup", candidate)
    # no clock: alone from the drafter's yield (x alone_margin), merged from min_score
    counted = _measured(yields={candidate.key: Mean(0.6)}, drafter=0.5)
    assert choice(counted, pace=False) == Choice("lookup", candidate)
    counted.drafter = Mean(2.0)
    assert choice(counted, pace=False) == Choice("both", candidate)
    counted.yields[candidate.key] = Mean(0.4)
    assert choice(counted, pace=False) == Choice("drafter")
    assert choice(counted, (), pace=False) == Choice("drafter")


def test_every_round_measures_what_each_candidate_would_have_had_accepted():
    """Prompt lookup's copy and suffix branches walked along the tokens committed after the
    round, whatever was verified; the drafter's yield and merge gain where it drafted."""
    greedy = SamplingParams(temperature=0.0)
    settings = HybridSettings(SuffixSettings(depth=8, max_draft=4, spec_factor=4), decay=0.0)
    drafter = _Fixed([7, 7, 7])
    proposer = HybridProposer(drafter, settings)
    # round 1: unmeasured, so the drafter drafts; "1 2" repeats, lookup copies "3 4 5 1"
    context = [1, 2, 3, 4, 5, 1, 2]
    assert proposer.propose(context, 4, greedy, None).tokens == [7, 7, 7]
    assert proposer.choices == {"drafter": 1} and drafter.calls == 1
    # the target commits 3 (rejecting 7), then 4, then 5 9: round 2 drafts again (a request's
    # first round is not timed: the drafter read the prompt there), round 3 is a plain step
    proposer.propose([*context, 3], 4, greedy, None)
    proposer.propose([*context, 3, 4], 4, greedy, None)
    assert proposer.choices == {"drafter": 2, "none": 1}
    measured = proposer.calibrations[0.0]
    assert measured.drafter.value == 0 and measured.yields == {}  # 2 tokens known: waits
    proposer.propose([*context, 3, 4, 5, 9], 4, greedy, None)
    lookup = measured.yields[("lookup", 2)]
    assert lookup.value == 3  # 3 4 5 of 3 4 5 1
    assert measured.gains[("lookup", 2)].value == 3  # the drafter's 7 took none of them
    assert set(measured.seconds) == {(True, 3), (False, 0)}
    # another temperature starts unmeasured: nothing is taken from T = 0's rounds
    sampled, drafted = SamplingParams(temperature=1.0, seed=0), drafter.calls
    proposer.propose(context, 4, sampled, torch.Generator().manual_seed(0))
    assert set(proposer.calibrations) == {0.0, 1.0} and drafter.calls == drafted + 1


def test_plain_steps_and_suffix_rounds_instead_of_a_slow_drafter_keep_greedy_identity(
    tiny_drafters, target_and_tokenizer, reference
):
    model, tokenizer = target_and_tokenizer
    runtime = load_drafter(tiny_drafters["eagle3"], model, tokenizer, from_name("hybrid-tree", 3))
    # the drafter measured often (and, with decay 0.99, kept) far slower than plain steps:
    # probed every 4 x probe_every rounds
    settings = HybridSettings(SuffixSettings(tree=True), decay=0.99, probe_every=8)
    proposer = HybridProposer(runtime.make_proposer().drafter, settings, SuffixCache())
    slow = Calibration(drafter=Mean(0.0, count=64), last={"drafter": 0, "none": 0})
    slow.seconds = {(True, 3): Mean(100.0), (False, 0): Mean(1e-3)}
    proposer.calibrations[0.0] = slow
    generator = SpeculativeGenerator(model, tokenizer, proposer, runtime.num_speculative_tokens)
    params = SamplingParams(max_new_tokens=32)
    for _ in range(2):  # the second pass drafts from the global cache
        assert [generator.generate(p, params).token_ids for p in PROMPTS] == reference
    alone = proposer.choices["suffix"] + proposer.choices["lookup"]
    assert proposer.choices["none"] > 0 and alone > 0, proposer.choices
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
    runtime = load_drafter(tiny_drafters["draft_lm"], model, tokenizer, from_name("hybrid", 3))
    generator = SpeculativeGenerator(model, tokenizer, runtime.make_proposer(), 3)
    params = SamplingParams(max_new_tokens=32)
    assert [generator.generate(p, params).token_ids for p in PROMPTS] == reference
    with pytest.raises(ProposerError, match="drafts chains only; hybrid trees"):
        load_drafter(tiny_drafters["draft_lm"], model, tokenizer, from_name("hybrid-tree", 3))
    from draftzoo.cli import main

    drafter = str(tiny_drafters["draft_lm"])
    assert main(["generate", "--drafter", drafter, "--hybrid", "--tree", "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("draftzoo: error: ") and "drafts chains only; hybrid trees" in err[-1]
    assert main(["generate", "--hybrid", "--prompt", "x"]) == 2
    assert capsys.readouterr().err.strip() == (
        "draftzoo: error: draftzoo generate: a hybrid proposal needs --drafter DRAFTER"
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
    # a fixed proposal length: the adaptive default times rounds, so would its round count
    args += ["--prompt", PROMPTS[0], "--max-new-tokens", "24", "--num-speculative-tokens", "4"]
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
    drafter = load_drafter(tiny_drafters["eagle3"], model, tokenizer, from_name("hybrid-tree", 3))
    config = EvalConfig(
        max_prompts=3,
        max_new_tokens=24,
        proposal=from_name("hybrid-tree"),
        certificate_samples=0,
    )
    report = evaluate(model, tokenizer, drafter, config, str(path), show_progress=False)
    assert report["serving"]["hybrid_rule"] == HybridSettings().rule()
    assert report["serving"]["hybrid_rule"]["pace"] is True
    for row in report["results"]:
        rounds = row["hybrid_rounds"]
        assert set(rounds) <= set(CHOICES) and sum(rounds.values()) > 0
        # every round the rule chose was one verification forward (warm-up prompt included)
        assert sum(rounds.values()) >= row["per_prompt"][0]["forwards"]
    # a card reproduces it as a hybrid tree and says what its rule weighs
    command = eval_command(report, "D")
    assert "--hybrid" in command and "--tree" in command
    record = {"family": "eagle3", "hidden_state_layers": [1, 1, 1]}
    card = render_card("d", record, report, [], "draftzoo train R")
    assert "measured tokens per second of each kind of round" in card


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
        draftzoo.load(folder, model, tokenizer, proposal="chain", hybrid=by_scores)
    assert main(["generate", "--drafter", str(folder), "--hybrid-by-scores", "--prompt", "x"]) == 2
    assert capsys.readouterr().err.strip() == (
        "draftzoo: error: draftzoo generate: --hybrid-by-scores sets the rule of --hybrid: add "
        "--hybrid"
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
