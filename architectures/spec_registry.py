"""A registry of specs by name (drafter families, model-free proposers): the built-in ones
loaded on first use, others added with `register` (tests, plugins)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


class SpecRegistry:
    """Specs with a `name`, in registration order; `what` names one in messages."""

    def __init__(
        self, what: str, builtin: Callable[[], Iterable[Any]], unknown: type[Exception]
    ) -> None:
        self.what, self._builtin, self._unknown = what, builtin, unknown
        self._held: dict[str, Any] = {}
        self._loaded = False

    def register(self, spec: Any) -> Any:
        """Add `spec`; another spec of the same name is refused."""
        held = self._held.get(spec.name)
        if held is not None and held != spec:
            raise ValueError(f"a {self.what} named {spec.name!r} is already registered")
        self._held[spec.name] = spec
        return spec

    def unregister(self, name: str) -> None:
        self._held.pop(name, None)

    def specs(self) -> dict[str, Any]:
        """Every registered spec by name (the built-in ones loaded first, once)."""
        if not self._loaded:
            self._loaded = True
            for spec in self._builtin():
                self.register(spec)
        return dict(self._held)

    def spec(self, name: str) -> Any:
        """The spec of `name`; an unknown name is an error listing the known ones."""
        specs = self.specs()
        if name not in specs:
            raise self._unknown(f"unknown {self.what} {name!r}; known: {', '.join(sorted(specs))}")
        return specs[name]
