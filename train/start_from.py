"""A run that starts from another run's checkpoint (`train.start_from`).

With the "wsd" schedule, a budget of B steps branched from a longer run's checkpoint at
`schedules.decay_start(B)` trains exactly as a run of B steps on its own would: the same
warm-up and stable rate (the longer run's rate up to there), the same rows in the same order
(the data order is a function of the step), then its own decay. One long run with pinned
checkpoints (`train.checkpoint_steps`) and short decays thus gives a whole scaling curve.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..architectures.errors import DraftzooError
from .checkpoint import PROGRESS_FILE


class StartFromError(DraftzooError, ValueError):
    """`train.start_from` names no checkpoint this run can continue."""


@dataclass(frozen=True)
class StartPoint:
    """A complete checkpoint of another run and its progress record."""

    path: Path
    progress: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.progress["step"])

    def record(self) -> dict[str, Any]:
        """What the drafter's training record says of it."""
        return {"checkpoint": str(self.path), "step": self.step}


def read_start_point(start_from: str, max_steps: int, data_hash: str) -> StartPoint:
    """The checkpoint `start_from` names, checked: complete, before `max_steps`, and saved by
    a run on the same data (its data position means nothing on other data)."""
    path = Path(start_from)
    where = f"train.start_from {path}"
    try:
        progress = json.loads((path / PROGRESS_FILE).read_text())
        step = int(progress["step"])
    except FileNotFoundError:
        raise StartFromError(
            f"{where}: not a complete checkpoint (no {PROGRESS_FILE}; name a "
            "`<work dir>/checkpoints/step-N` folder)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StartFromError(f"{where}: unreadable {PROGRESS_FILE} ({exc})") from None
    if not 0 < step < max_steps:
        raise StartFromError(f"{where} is at step {step}: not before train.max_steps {max_steps}")
    saved_hash = progress.get("data_hash")
    if saved_hash != data_hash:
        raise StartFromError(
            f"{where} was trained on other data (data hash {saved_hash or 'not recorded'}, "
            f"this run's {data_hash}): a run continues only on its own data"
        )
    return StartPoint(path, progress)


def load_start_point(accelerator, start: StartPoint) -> None:
    """`accelerator.load_state` from `start`, its refusals in one line."""
    try:
        accelerator.load_state(str(start.path))
    except (RuntimeError, KeyError, ValueError, FileNotFoundError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StartFromError(
            f"train.start_from {start.path} does not fit this run's drafter: {first}"
        ) from None
