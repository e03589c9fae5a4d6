"""Held-out checks: which evaluation prompts overlap the training data, and `eval` dropping
them before it takes its prompts."""

from __future__ import annotations

import json

from draftzoo.data.dedupe import training_text, words
from draftzoo.data.prompts import load_prompt_set
from draftzoo.eval.runner import EvalConfig, heldout_record, load_prompts

COPIED = "Write a function that returns the sum of all even numbers in a list."


def _conversations(path, rows):
    path.write_text(
        "".join(
            json.dumps(
                {"messages": [{"role": "user", "content": u}, {"role": "assistant", "content": a}]}
            )
            + "\n"
            for u, a in rows
        )
    )
    return path


def test_copies_are_found_through_case_spacing_and_punctuation(tmp_path):
    train = _conversations(
        tmp_path / "train.jsonl",
        [
            (
                "Please: WRITE a function that returns   the sum of all even numbers!",
                "def f(x): ...",
            ),
            ("Hello there", "Hi! How can I help you today with your code?"),
        ],
    )
    text = training_text([str(train)])
    assert words("Don't  STOP-now") == ["don", "t", "stop", "now"]
    assert text.overlaps(COPIED)  # 8 words in a row of the first user turn
    assert text.overlaps("hello, THERE.")  # a short prompt equal to a whole turn
    assert text.overlaps("so: how can i help you today with your code")  # an answer's words
    assert not text.overlaps("Hello")
    assert not text.overlaps("Write a function that returns the product of odd numbers.")
    assert text.sources[0]["rows"] == 2 and len(text.sources[0]["sha256"]) == 64


def test_eval_drops_overlapping_prompts_first_and_counts_them(tmp_path):
    prompts = _conversations(
        tmp_path / "eval-turns.jsonl",
        [
            (f"Question number {i} about something else entirely, please answer", "")
            for i in range(6)
        ],
    )
    lines = prompts.read_text().splitlines()
    lines[1] = json.dumps({"messages": [{"role": "user", "content": COPIED}]})
    prompts.write_text("\n".join(lines) + "\n")
    assert [p.text for p in load_prompt_set(str(prompts))][1] == COPIED  # conversation rows
    train = _conversations(tmp_path / "train.jsonl", [(COPIED, "def f(x): return x")])
    config = EvalConfig(prompt_sets=(str(prompts),), max_prompts=4, heldout_from=(str(train),))
    chosen = load_prompts(config)
    assert len(chosen) == 5 and COPIED not in [p.text for p in chosen]
    assert [p.prompt_id for p in chosen] == ["1", "3", "4", "5", "6"]
    record = heldout_record(config)
    assert record["sets"] == {str(prompts): {"prompts": 6, "overlapping": 1}}
    assert record["ngram"] == 8 and record["sources"][0]["source"] == str(train)
    assert heldout_record(EvalConfig(prompt_sets=(str(prompts),))) is None
    from draftzoo.eval.model_card import heldout_lines

    (card,) = [line for line in heldout_lines({"heldout": record}) if line]
    assert f"{prompts} 1/6" in card and "8-word windows" in card and "(1 rows)" in card


def test_humaneval_does_not_overlap_the_testbeds_training_pairs():
    """The committed target's own training rows (testbed-chat) and HumanEval are disjoint."""
    config = EvalConfig(heldout_from=("testbed-chat",))
    assert heldout_record(config)["sets"]["humaneval"]["overlapping"] == 0
