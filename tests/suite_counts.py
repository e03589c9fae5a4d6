"""Tallies the robustness tests keep, printed at the end of a pytest run (`conftest.py`).

`KILLS[command]`: SIGKILLs a command survived (rerun, nothing lost); `BAD_INPUTS[command]`: bad
inputs it refused with one clean error line, nothing written; `GENERATED["<kind> refused"]` and
`GENERATED["<kind> accepted"]`: generated damaged inputs run clean (one error line, or a
success), the canary beside them unchanged; `WRITERS["<command>: <variant>"]`: runs of a
writing command with links planted at the names it touches, inputs inside its output, linked
inputs or another umask (`tests/test_every_writer.py`), nothing outside written, nothing lost.
"""

from __future__ import annotations

from collections import Counter

KILLS: Counter[str] = Counter()
BAD_INPUTS: Counter[str] = Counter()
GENERATED: Counter[str] = Counter()
WRITERS: Counter[str] = Counter()


def summary_lines() -> list[str]:
    """The lines printed after the test results (none when no such test ran)."""
    lines = []
    if KILLS:
        parts = ", ".join(f"{name} {count}" for name, count in sorted(KILLS.items()))
        lines.append(f"fault injection: {sum(KILLS.values())} kill points survived ({parts})")
    if BAD_INPUTS:
        parts = ", ".join(f"{name} {count}" for name, count in sorted(BAD_INPUTS.items()))
        lines.append(
            f"bad inputs: {sum(BAD_INPUTS.values())} refused with one error line ({parts})"
        )
    if GENERATED:
        parts = ", ".join(f"{name} {count}" for name, count in sorted(GENERATED.items()))
        lines.append(
            f"generated bad inputs: {sum(GENERATED.values())} run clean, canary unchanged ({parts})"
        )
    if WRITERS:
        lines.append(
            f"writers under hazards: {sum(WRITERS.values())} runs, nothing outside written,"
            f" nothing lost ({', '.join(f'{n} {c}' for n, c in sorted(WRITERS.items()))})"
        )
    return lines
