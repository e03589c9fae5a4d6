"""Errors the runtime raises for requests it refuses."""

from ..architectures.errors import DraftzooError


class GenerationError(DraftzooError, ValueError):
    """A request the runtime refuses (empty prompt, prompt longer than the context, bad sampling
    settings, ...)."""
