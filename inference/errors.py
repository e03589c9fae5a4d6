"""Errors the runtime raises for requests it refuses."""


class GenerationError(ValueError):
    """A request the runtime refuses (empty prompt, prompt longer than the context, bad sampling
    settings, ...)."""
