"""Instruction pairs mined from Python source with `ast`: signature + docstring -> function."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

#: The user turn of every instruction pair: this text, then the signature and docstring.
INSTRUCTION = "Complete this Python function.\n\n"


@dataclass(frozen=True)
class FunctionPair:
    """One documented function split into its prompt and its full source."""

    name: str
    prompt: str  # the `def` line(s) and the docstring, as written in the file (dedented)
    solution: str  # the whole function, dedented

    def as_messages(self) -> list[dict[str, str]]:
        """The pair as OpenAI-style chat messages."""
        return [
            {"role": "user", "content": INSTRUCTION + self.prompt},
            {"role": "assistant", "content": self.solution},
        ]


def _header_end(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """1-based last line of the signature + docstring (the docstring is body[0])."""
    return node.body[0].end_lineno or node.body[0].lineno


def iter_function_pairs(
    source: str, min_body_lines: int = 2, max_lines: int = 80
) -> Iterator[FunctionPair]:
    """Documented functions (module level and in classes) with a body after the docstring.

    Functions whose text is not recoverable (decorators spanning odd lines, tabs mixed with
    spaces that break dedent) are skipped. Unparseable sources yield nothing.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return
    lines = source.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if ast.get_docstring(node) is None or len(node.body) < 2:
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        end = node.end_lineno or node.lineno
        header_end = _header_end(node)
        if end - header_end < min_body_lines or end - start + 1 > max_lines:
            continue
        solution = textwrap.dedent("\n".join(lines[start - 1 : end]))
        prompt = textwrap.dedent("\n".join(lines[start - 1 : header_end]))
        if not solution.startswith(("def ", "async def ", "@")) or "\t" in solution:
            continue
        yield FunctionPair(node.name, prompt + "\n", solution + "\n")
