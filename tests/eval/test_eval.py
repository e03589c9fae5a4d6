"""`draftzoo eval` on real tiny drafters: the report's numbers, identity, plots, prompt sets."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from draftzoo.data.prompts import PromptSetError, load_prompt_set
from draftzoo.eval.plots import crossover, plot_report
from draftzoo.eval.runner import EvalConfig, evaluate, summary_text, write_report
from draftzoo.inference.load import load_drafter, load_target
from draftzoo.inference.proposal_settings import from_name

PNG = b"\x89PNG\r\n\x1a\n"


def question_file(path: Path) -> Path:
    """An MT-bench-format file whose questions are real HumanEval prompts, two categories."""
    prompts = load_prompt_set("humaneval")[:4]
    rows = [
        {"question_id": i, "category": "even" if i % 2 == 0 else "odd", "turns": [p.text, "more"]}
        for i, p in enumerate(prompts)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def eagle3_report(tiny_drafters, tiny_target_model, tmp_path_factory):
    model, tokenizer, path = tiny_target_model
    drafter = load_drafter(tiny_drafters["eagle3"], model, tokenizer, from_name("chain", 3))
    questions = question_file(tmp_path_factory.mktemp("q") / "question.jsonl")
    config = EvalConfig(
        prompt_sets=(str(questions),),
        max_prompts=3,
        max_new_tokens=16,
        temperatures=(0.0, 1.0),
        batch_sizes=(1, 2),
        repeats=2,
        certificate_samples=300,
        certificate_prompts=2,
    )
    return evaluate(model, tokenizer, drafter, config, str(path), show_progress=False)


def test_report_numbers_are_consistent(eagle3_report, tiny_drafters):
    from draftzoo.architectures.drafter_io import checkpoint_hash

    report = eagle3_report
    assert report["checkpoint"]["sha256"] == checkpoint_hash(tiny_drafters["eagle3"])
    assert report["categories"] == ["even", "odd"]
    assert [(r["temperature"], r["batch_size"]) for r in report["results"]] == [
        (0.0, 1),
        (0.0, 2),
        (1.0, 1),
        (1.0, 2),
    ]
    for result in report["results"]:
        assert result["prompts"] == 3
        assert 1.0 <= result["tau"] <= 4.0  # chain of 3 + the bonus token
        assert len(result["speedup"]["per_repeat"]) == 2
        assert result["speedup"]["min"] <= result["speedup"]["mean"] <= result["speedup"]["max"]
        assert all(0.0 <= a <= 1.0 for a in result["acceptance_per_position"])
        # acceptance of position k+1 needs position k accepted
        accept = result["acceptance_per_position"]
        assert all(a >= b for a, b in itertools.pairwise(accept))
        per_prompt = result["per_prompt"]
        assert [p["id"] for p in per_prompt] == ["1", "2", "3"]  # question 0 is the warm-up
        if result["temperature"] == 0:
            identity = result["greedy_identity"]
            assert identity == {
                "identical": 6,
                "decodes": 6,
                "rate": 1.0,
                "reference": "target-only at the same batch size",
            }
        else:
            assert "greedy_identity" not in result
    at_batch_one = report["results"][0]
    tokens = sum(p["tokens"] for p in at_batch_one["per_prompt"])
    forwards = sum(p["forwards"] for p in at_batch_one["per_prompt"])
    assert at_batch_one["tau"] == pytest.approx(tokens / forwards)  # greedy: repeats agree
    memory = report["memory"]
    assert memory["target_bytes"] > memory["drafter_bytes"] > 0
    assert memory["peak_kv_cache_bytes"] > 0
    assert report["versions"]["torch"] and report["hardware"]["cpu_count"]
    certificate = report["certificate"]  # sampled at T = 1 whatever the temperatures measured
    assert certificate["passed"] and certificate["acceptance"] == "exact"
    assert [r["prompt"] for r in certificate["per_prompt"]] == [1, 2]
    assert all(r["tv"] <= r["threshold"] for r in certificate["per_prompt"])
    # the CPU by name, so reports from different machines are told apart
    assert report["hardware"]["cpu_model"] and report["hardware"]["cpu_native_bf16"] in (
        True,
        False,
        None,
    )


def test_report_files_and_plots(eagle3_report, tmp_path):
    path = write_report(eagle3_report, tmp_path)
    assert json.loads(path.read_text()) == json.loads(json.dumps(eagle3_report))
    summary = (tmp_path / "summary.txt").read_text()
    assert "tau" in summary and "losslessness certificate PASSED" in summary
    assert summary_text(eagle3_report).count("\n") > 8
    written = plot_report(eagle3_report, tmp_path)
    assert [p.name for p in written] == ["acceptance.png", "categories.png", "batch.png"]
    assert all(p.read_bytes().startswith(PNG) for p in written)


def test_crossover_is_the_first_batch_size_that_loses():
    assert crossover([(1, 1.8), (2, 1.5), (8, 1.04), (16, 0.97)]) == 16
    assert crossover([(1, 1.2), (4, 1.1)]) is None


def test_question_files_and_their_errors(tmp_path):
    prompts = load_prompt_set(str(question_file(tmp_path / "q.jsonl")))
    assert [p.category for p in prompts] == ["even", "odd", "even", "odd"]
    assert prompts[0].instruction == ""  # the question is the whole user turn
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["ok"]}\n{"category": "x"}\n')
    with pytest.raises(PromptSetError, match=r"bad.jsonl:2: expected a JSON object with 'turns'"):
        load_prompt_set(str(bad))
    with pytest.raises(PromptSetError, match="does not exist"):
        load_prompt_set(str(tmp_path / "missing.jsonl"))


def test_config_rejects_contradictions():
    with pytest.raises(ValueError, match="proposal"):
        EvalConfig(proposal="beam")
    with pytest.raises(ValueError, match="fixes num_speculative_tokens"):
        EvalConfig(proposal=from_name("chain", None))
    with pytest.raises(ValueError, match="batch sizes"):
        EvalConfig(batch_sizes=(0,))
    with pytest.raises(ValueError, match="dtype must be one of"):
        EvalConfig(dtype="int8")


def test_an_eval_in_bfloat16_loads_both_models_so_and_says_so(
    tiny_drafters, testbed_tiny, tmp_path
):
    """`--dtype bfloat16`: the target and the drafter run in bfloat16, the report, its summary
    and the leaderboard's group say so; an older report without the field reads as float32."""
    from draftzoo.cli import main
    from draftzoo.eval.leaderboard import group_of
    from draftzoo.eval.model_card import render_card

    out = tmp_path / "eval"
    argv = [
        *("eval", str(tiny_drafters["eagle3"]), "--target", str(testbed_tiny[0])),
        *("--prompts", "2", "--max-new-tokens", "12", "--temperatures", "0"),
        *("--num-speculative-tokens", "3", "--certificate-samples", "0"),
        *("--dtype", "bfloat16", "--device", "cpu", "--output-dir", str(out)),
    ]
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["dtype"] == "bfloat16"
    model, _ = load_target(str(testbed_tiny[0]))
    weights = sum(p.numel() for p in model.parameters())
    assert 2 * weights <= report["memory"]["target_bytes"] < 3 * weights  # two bytes a weight
    assert "(bfloat16)" in summary_text(report)
    older = {**report, "config": {k: v for k, v in report["config"].items() if k != "dtype"}}
    assert group_of(report) == group_of(older) + "; bfloat16 weights"
    assert EvalConfig.from_report(older).dtype == "float32"
    record = {"family": "eagle3", "training": {}}
    assert "target and drafter in bfloat16" in render_card("x", record, report, [], "train")
    # a greedy decode that left the target's output (bf16 rounding): never called lossless
    greedy = report["results"][0]["greedy_identity"]
    flipped = {**greedy, "identical": greedy["decodes"] - 1}
    report["results"][0] = {**report["results"][0], "greedy_identity": flipped}
    card = render_card("x", record, report, [], "train")
    said = f"in bfloat16, greedy output equaled target-only decoding's in {flipped['identical']} of"
    assert "**Not lossless as measured**" in card and said in card
    assert "Speculative decoding with it is lossless" not in card


def test_teacher_forced_reports_split_the_first_step_by_draft_position(
    tiny_drafters, tiny_target_model, capsys
):
    """`--position-edges` carries the first step's split by draft position into the report (the
    module's buckets for the report's own sequences), its summary and its command."""
    from dataclasses import asdict

    from draftzoo.architectures.target import TargetAdapter
    from draftzoo.cli import main
    from draftzoo.eval.model_card import eval_command
    from draftzoo.eval.runner import load_prompts
    from draftzoo.eval.teacher_forced import target_sequences, teacher_forced_scores
    from draftzoo.inference.sampling import SamplingParams

    model, tokenizer, path = tiny_target_model
    drafter = load_drafter(tiny_drafters["eagle3"], model, tokenizer, from_name("chain", 3))
    config = EvalConfig(
        max_prompts=2,
        max_new_tokens=12,
        temperatures=(0.0,),
        proposal=from_name("chain", 3),
        teacher_forced=True,
        position_edges=(24,),
        certificate_samples=0,
    )
    report = evaluate(model, tokenizer, drafter, config, str(path), show_progress=False)
    (entry,) = report["teacher_forced"]
    texts = [p.render(tokenizer, True) for p in load_prompts(config)[1:]]
    params = SamplingParams(max_new_tokens=12, seed=1)
    sequences = target_sequences(model, tokenizer, texts, params)
    scores = teacher_forced_scores(
        drafter.module, TargetAdapter(model, tokenizer), sequences, params, 3, position_edges=[24]
    )
    assert entry["first_step_by_position"] == [asdict(b) for b in scores.by_position]
    assert [(b["start"], b["end"]) for b in entry["first_step_by_position"]] == [
        (0, 24),
        (24, None),
    ]
    assert sum(b["positions"] for b in entry["first_step_by_position"]) == entry["positions"]
    assert "first step by draft position 0-23 " in summary_text(report)
    assert eval_command(report, "D").endswith("--teacher-forced --position-edges 24")
    with pytest.raises(ValueError, match="also set teacher_forced"):
        EvalConfig(position_edges=(128,))
    with pytest.raises(ValueError, match="must increase"):
        EvalConfig(teacher_forced=True, position_edges=(256, 128))
    # the command line says so before it loads anything
    assert main(["eval", str(tiny_drafters["eagle3"]), "--position-edges", "128"]) == 2
    assert "(--teacher-forced)" in capsys.readouterr().err


def test_teacher_forced_field_is_the_chains_teacher_forced_score(
    tiny_drafters, tiny_target_model, capsys
):
    """`--teacher-forced` adds, per temperature, the module's scores of the report's own
    prompts (seeded like the first repeat's decodes); other families are refused up front."""
    from draftzoo.architectures.target import TargetAdapter
    from draftzoo.cli import main
    from draftzoo.eval.model_card import eval_command, render_card
    from draftzoo.eval.runner import load_prompts
    from draftzoo.eval.teacher_forced import target_sequences, teacher_forced_scores
    from draftzoo.inference.sampling import SamplingParams

    model, tokenizer, path = tiny_target_model
    drafter = load_drafter(tiny_drafters["eagle3"], model, tokenizer, from_name("chain", 3))
    config = EvalConfig(
        max_prompts=2,
        max_new_tokens=12,
        proposal=from_name("chain", 3),
        teacher_forced=True,
        certificate_samples=0,
    )
    report = evaluate(model, tokenizer, drafter, config, str(path), show_progress=False)
    entries = report["teacher_forced"]
    assert [e["temperature"] for e in entries] == [0.0, 1.0]
    texts = [p.render(tokenizer, True) for p in load_prompts(config)[1:]]
    adapter = TargetAdapter(model, tokenizer)
    for entry in entries:
        params = SamplingParams(temperature=entry["temperature"], max_new_tokens=12, seed=1)
        sequences = target_sequences(model, tokenizer, texts, params)
        scores = teacher_forced_scores(drafter.module, adapter, sequences, params, 3)
        assert entry["steps"] == 3 and entry["positions"] == scores.positions > 0
        assert entry["acceptance_per_step"] == scores.acceptance
        assert entry["tau"] == scores.tau and 1.0 <= entry["tau"] <= 4.0
        assert 0.0 <= entry["outside_mass"] <= 1.0
        assert entry["first_step_repeated"]["positions"] == scores.repeated.positions
        assert entry["first_step_fresh"]["acceptance"] == scores.fresh.acceptance
    assert "T=1: teacher-forced tau" in summary_text(report)
    assert "first step on repeated bigrams" in summary_text(report)
    assert eval_command(report, "D").endswith("--teacher-forced")
    record = {"family": "eagle3", "hidden_state_layers": [1, 1, 1]}
    assert "T=0, teacher-forced on the target's continuations: tau" in render_card(
        "d", record, report, [], "draftzoo train R"
    )

    draft_lm = load_drafter(tiny_drafters["draft_lm"], model, tokenizer, from_name("chain", 3))
    with pytest.raises(ValueError, match="scores EAGLE-1, EAGLE-3 drafters"):
        evaluate(model, tokenizer, draft_lm, config, str(path), show_progress=False)
    assert main(["eval", str(tiny_drafters["draft_lm"]), "--teacher-forced"]) == 2
    assert "--teacher-forced scores EAGLE-1, EAGLE-3 drafters" in capsys.readouterr().err


def test_eval_command_measures_on_static_caches(tiny_drafters, testbed_tiny, tmp_path, capsys):
    """`draftzoo eval --static-cache --device cpu`: target-only and speculative decoding both
    on static caches (batch 1 and a batch of 2), the certificate too; the report says so, and
    the leaderboard never ranks it with growing-cache rows."""
    from draftzoo.cli import main
    from draftzoo.eval.leaderboard import group_of
    from draftzoo.inference.cpu_kernels import NOTE

    out = tmp_path / "eval"
    argv = [
        *("eval", str(tiny_drafters["eagle3"]), "--target", str(testbed_tiny[0])),
        *("--prompts", "2", "--max-new-tokens", "12", "--temperatures", "0"),
        *("--batch-sizes", "1", "2", "--num-speculative-tokens", "3"),
        *("--certificate-samples", "60", "--certificate-prompts", "1"),
        *("--static-cache", "--max-cache-length", "300", "--device", "cpu"),
        *("--output-dir", str(out)),
    ]
    assert main(argv) == 0
    capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["static_cache"] is True
    assert report["config"]["max_cache_length"] == 300
    assert report["hardware"]["device"] == "cpu"
    for result in report["results"]:
        assert result["greedy_identity"]["rate"] == 1.0
        assert result["greedy_identity"]["decodes"] == 2
    assert report["certificate"]["passed"]
    growing = {**report, "config": {**report["config"], "static_cache": False}}
    assert group_of(report) == group_of(growing) + "; static caches"
    # verified on the CPU kernels (the default here): never ranked with the stock kernels' rows
    assert report["serving"]["verification_kernels"] == NOTE
    stock = {**report, "serving": {**report["serving"], "verification_kernels": "stock (asked)"}}
    assert group_of(report) == group_of(stock).replace("; static", "; packed CPU kernels; static")


def test_a_prompt_set_narrowed_to_categories(tmp_path):
    """`SET:CATEGORY[,CATEGORY]`: those categories alone, in set order; an unknown or empty
    category is one line naming the set's own."""
    questions = str(question_file(tmp_path / "question.jsonl"))
    assert [p.category for p in load_prompt_set(questions + ":odd")] == ["odd", "odd"]
    both = load_prompt_set(questions + ":odd,even")
    assert [p.prompt_id for p in both] == ["0", "1", "2", "3"]
    for bad in ("math", "odd,", ""):
        with pytest.raises(PromptSetError, match=r"no category .* its categories: even, odd"):
            load_prompt_set(f"{questions}:{bad}")
    with pytest.raises(PromptSetError, match="unknown prompt set 'humaneva'"):
        load_prompt_set("humaneva:humaneval")
