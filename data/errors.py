"""Errors of the data pipeline."""

from __future__ import annotations

from ..architectures.errors import DraftzooError


class DataError(DraftzooError, ValueError):
    """A dataset that cannot be read, or a malformed row in a strict run."""
