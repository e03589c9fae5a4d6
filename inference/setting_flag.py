"""One command-line flag that sets one field of a settings dataclass (tree kinds, model-free
proposers): `--flag VALUE` sets `field`, `parse` reads VALUE."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SettingFlag:
    flag: str
    field: str
    parse: Callable[[str], Any]
    help: str
    #: `draftzoo eval` takes it too (False: `generate` only, e.g. a file kept across runs)
    in_eval: bool = True

    @property
    def dest(self) -> str:
        """The flag's name in parsed arguments and in a report's flat config."""
        return self.flag[2:].replace("-", "_")
