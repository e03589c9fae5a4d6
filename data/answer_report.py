"""What a file of regenerated answers holds: rows, answers and their tokens, answers that stopped
at the token cap, empty answers, refusals and duplicates.

Token counts and cap stops come from what `draftzoo regenerate` recorded while generating (each
row's `answers`); answers written without that record (a file begun by an older draftzoo) are
counted apart, never guessed. A refusal is an answer whose opening (its first 200 characters)
apologises or declines (`REFUSAL`: "I'm sorry", "I cannot", "as an AI", ...): a phrase match,
so it counts disclaimers that go on to help as well. Duplicates compare text with case and
spacing folded, against every earlier row.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

#: the opening of an answer that apologises, declines or disclaims an ability
REFUSAL = re.compile(
    r"\b(i'?m sorry|i am sorry|i apologi[sz]e|i cannot|i can'?t|i can not|i'?m unable|"
    r"i am unable|i'?m not able|i am not able|i'?m not equipped|i don'?t have the ability|"
    r"as an ai|as a text-based ai|as a language model|as an? (?:ai )?assistant,? i)\b",
    re.IGNORECASE,
)
OPENING = 200  # characters of an answer that the refusal match reads


@dataclass
class AnswerReport:
    """Counts over one regenerated file."""

    rows: int = 0  # conversation rows
    answers: int = 0  # regenerated assistant turns
    answer_tokens: int = 0  # generated tokens of the recorded answers (end token excluded)
    at_cap: int = 0  # recorded answers that did not end their turn within the token cap
    unrecorded: int = 0  # answers written without their lengths: in no token or cap count
    empty: int = 0
    refusals: int = 0
    duplicate_answers: int = 0
    duplicate_requests: int = 0  # rows whose first user turn an earlier row already asked

    def summary(self) -> str:
        recorded = self.answers - self.unrecorded
        line = (
            f"{self.rows} rows, {self.answers} answers, {self.answer_tokens} answer tokens; "
            f"{self.at_cap} of {recorded} recorded answers stopped at the token cap, "
            f"{self.empty} empty, {self.refusals} refusals (opening phrase), "
            f"{self.duplicate_answers} duplicate answers, "
            f"{self.duplicate_requests} duplicate requests"
        )
        if self.unrecorded:
            line += f"; {self.unrecorded} answers without recorded lengths"
        return line

    def to_dict(self) -> dict:
        return asdict(self)


def _fold(text: str) -> str:
    return " ".join(text.lower().split())


def answer_report(path: Path) -> AnswerReport:
    """Count what `path`, a file `draftzoo regenerate` wrote, holds."""
    report = AnswerReport()
    seen_answers: set[str] = set()
    seen_requests: set[str] = set()
    with Path(path).open(encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            messages = row.get("messages")
            if not messages:
                continue
            report.rows += 1
            request = next((m["content"] for m in messages if m["role"] == "user"), None)
            if request is not None:
                report.duplicate_requests += _fold(request) in seen_requests
                seen_requests.add(_fold(request))
            answers = [m["content"] for m in messages if m["role"] == "assistant"]
            _count_answers(report, answers, row.get("answers"), seen_answers)
    return report


def _count_answers(report: AnswerReport, answers: list[str], lengths, seen: set[str]) -> None:
    report.answers += len(answers)
    if lengths is None or len(lengths) != len(answers):
        report.unrecorded += len(answers)
    else:
        report.answer_tokens += sum(length["tokens"] for length in lengths)
        report.at_cap += sum(not length["finished"] for length in lengths)
    for answer in answers:
        report.empty += not answer
        report.refusals += bool(REFUSAL.search(answer[:OPENING]))
        report.duplicate_answers += bool(answer) and _fold(answer) in seen
        seen.add(_fold(answer))
