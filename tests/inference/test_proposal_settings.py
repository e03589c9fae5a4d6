"""How a drafter is asked to propose: one typed value, one codec between it and CLI flags, an
eval report's config and a zoo entry's serving; model-free proposers registered the way
families are (tests/toy_proposer: its own file and one registry line)."""

from __future__ import annotations

import io
import json
import tokenize
from pathlib import Path

import pytest

from draftzoo.architectures.zoo_index import ZooIndex, builtin_zoo_dir
from draftzoo.cli import build_parser, main
from draftzoo.eval.machine_load import unreliable_sentence
from draftzoo.eval.runner import EvalConfig
from draftzoo.inference.model_free import model_free_specs, register, unregister
from draftzoo.inference.proposal_settings import (
    KINDS,
    OWN_TREE,
    ProposalSettings,
    config_record,
    from_config,
    from_flags,
    from_serving,
    serving_record,
    to_flags,
    tree_kind_of,
)
from draftzoo.inference.proposers.hybrid_rule import HybridSettings
from draftzoo.inference.proposers.position_tree import PositionTree
from draftzoo.inference.tree import TreeSettings
from tests.toy_proposer.repeat_last import MODEL_FREE_SPEC as REPEAT_LAST

REPO = Path(__file__).resolve().parents[2]
SETTINGS = [
    ProposalSettings(),
    ProposalSettings(num_speculative_tokens=7),
    ProposalSettings(tree=OWN_TREE),
    ProposalSettings(tree=TreeSettings(top_k=4, depth=3, total_tokens=12, sampled_children=2)),
    ProposalSettings(tree=PositionTree(((0,), (1,), (0, 0)))),
    ProposalSettings(hybrid=HybridSettings()),
    ProposalSettings(tree=OWN_TREE, hybrid=HybridSettings(pace=False)),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: s.describe())
def test_the_codec_round_trips_flags_a_reports_config_and_a_zoo_entrys_serving(settings):
    args = build_parser().parse_args(["eval", "some-drafter", *to_flags(settings)])
    assert from_flags(args) == settings
    assert from_config(json.loads(json.dumps(config_record(settings)))) == settings
    tree_kind = type(settings.tree) if settings.tree not in (None, OWN_TREE) else None
    assert from_serving(json.loads(json.dumps(serving_record(settings))), tree_kind) == settings
    adaptive = ProposalSettings(num_speculative_tokens=None)  # generate's default length
    generate = ["generate", "--prompt", "x"]
    assert from_flags(build_parser().parse_args(generate)) == adaptive


def test_every_shipped_report_and_zoo_entry_decodes_to_what_it_served():
    """Reports written before the value (every tree field written flat, EAGLE-2's defaults
    for chains too) decode to the settings their drafters were served with."""
    zoo = ZooIndex(builtin_zoo_dir())
    for name, entry in zoo.entries().items():
        report = json.loads((zoo.folder(name) / "report.json").read_text())
        kind = tree_kind_of(entry["family"])
        served = from_serving(entry["serving"], kind)
        asked = EvalConfig.from_report(report).proposal
        assert served == from_serving(report["serving"], kind), name
        assert asked.kind == served.kind == report["config"]["proposal"], name
        assert served.num_speculative_tokens == report["serving"]["num_speculative_tokens"]
        if served.drafts_tree:  # the family's own tree asked for, the tree it drafted served
            assert asked.tree is OWN_TREE and served.tree_record() == entry["serving"]["tree"]
        assert config_record(asked)["num_speculative_tokens"] == asked.num_speculative_tokens


def test_no_module_but_the_codec_spells_a_proposal_kind():
    found = []
    for folder in ("draftzoo", "architectures", "data", "train", "inference", "eval"):
        for path in sorted((REPO / folder).glob("*.py")):
            if path.name == "proposal_settings.py":
                continue
            for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
                if token.type == tokenize.STRING and token.string.strip("\"'") in KINDS:
                    found.append(f"{path.relative_to(REPO)}:{token.start[0]}: {token.string}")
    assert not found, "\n".join(found)


def test_the_busy_machine_warning_says_when_the_proposal_itself_reads_the_clock():
    timing = {"reliable": False, "why_unreliable": "other processes used 40 %"}
    timed = serving_record(ProposalSettings(hybrid=HybridSettings()))
    untimed = serving_record(ProposalSettings(hybrid=HybridSettings(pace=False)))
    said = unreliable_sentence({"timing": timing, "serving": timed})
    assert "depend on the clock too, through the hybrid rule" in said
    for serving in (untimed, serving_record(ProposalSettings())):
        said = unreliable_sentence({"timing": timing, "serving": serving})
        assert "do not depend on the clock (this proposal times nothing)" in said
    assert ProposalSettings(num_speculative_tokens=None).clock_dependent()
    by_scores = build_parser().parse_args(["eval", "d", "--hybrid", "--hybrid-by-scores"])
    assert from_flags(by_scores).clock_dependent() == ()  # a measurement that reproduces


def test_bad_proposals_are_one_line_each(capsys):
    cases = [
        (["--tree-choices", "[[0]]"], "--tree-choices shapes a tree: also pass --tree"),
        (["--tree", "--tree-top-k", "4", "--tree-choices", "[[0]]"], "different tree kinds"),
        (["--hybrid-by-scores"], "--hybrid-by-scores sets the rule of --hybrid: add --hybrid"),
        (["--min-ngram", "2"], "--min-ngram sets prompt lookup: add --prompt-lookup"),
        (["--suffix-depth", "8"], "--suffix-depth sets suffix decoding: add --suffix or --hybrid"),
        (["--prompt-lookup", "--tree"], "--prompt-lookup drafts chains only (drop --tree)"),
    ]
    for flags, said in cases:
        assert main(["generate", "--prompt", "x", *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("draftzoo: error: ") and said in err[0]
    with pytest.raises(ValueError, match="proposal must be one of"):
        from_config({"proposal": "beam"})
    with pytest.raises(ValueError, match=r"serving.tree .* is not a tree"):
        from_serving({"proposal": "tree", "tree": {"choices": "x"}}, PositionTree)


@pytest.fixture
def repeat_last():
    register(REPEAT_LAST)
    yield REPEAT_LAST
    unregister(REPEAT_LAST.name)


def test_a_model_free_proposer_needs_only_its_file_and_one_registry_line(
    repeat_last, testbed_tiny, tmp_path, capsys
):
    from draftzoo.eval import leaderboard

    target = str(testbed_tiny[0])
    prompt = ["--prompt", "def add(a, b):\n", "--max-new-tokens", "12"]
    base = ["generate", "--target", target, *prompt]
    assert main([*base, "--repeat-last", "--repeat-copies", "3"]) == 0
    assert "num_target_forwards" in capsys.readouterr().out
    assert main([*base, "--repeat-copies", "3"]) == 2
    said = "--repeat-copies sets repeat last: add --repeat-last"
    assert said in capsys.readouterr().err
    assert main([*base, "--repeat-last", "--tree"]) == 2
    assert "--repeat-last drafts chains only" in capsys.readouterr().err

    out = tmp_path / "eval"
    argv = ["eval", "--repeat-last", "--target", target, "--prompts", "2"]
    argv += ["--max-new-tokens", "12", "--temperatures", "0", "--certificate-samples", "0"]
    assert main([*argv, "--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert (
        report["checkpoint"]["family"] == "repeat_last" and report["checkpoint"]["sha256"] is None
    )
    assert report["results"][0]["greedy_identity"]["rate"] == 1.0
    assert report["serving"]["proposal"] == "chain"
    row = leaderboard.row_from_report(report, "repeat-last", None)
    assert row.reference and row.proposal == "chain of 4"
    assert "repeat last" in leaderboard.render([row], "t", plot=None)
    assert "repeat_last" in model_free_specs()
