"""The root of every error draftzoo raises on purpose.

The CLI prints any `DraftzooError` as one line, `draftzoo: error: <message>`, and exits 2.
Each part of the package subclasses it (`ConfigError`, `TargetError`, `GenerationError`, ...),
keeping `ValueError` / `LookupError` beside it where callers already catch those.
"""

from __future__ import annotations


class DraftzooError(Exception):
    """Bad input, a refused request, or a file that is not what it should be."""


class ExportError(DraftzooError, ValueError):
    """A drafter that cannot be written in the asked format (`architectures/export.py`)."""


class TargetError(DraftzooError, ValueError):
    """The model cannot serve as a target, or a hidden-state index does not exist."""
