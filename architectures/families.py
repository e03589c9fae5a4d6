"""The registry of drafter families: one `FamilySpec` per family, declared in its own files.

Every shared module (training, loading, evaluation, export, cards, the CLI) asks the registry
what a family does instead of asking "is this EAGLE?". A family's spec names its pieces by
dotted path (`"draftzoo.inference.proposers.eagle:load_runtime"`), resolved only when used, so this
module imports nothing above `architectures` and a family's training code is never loaded to
serve it.

    from draftzoo.architectures.families import family_spec
    spec = family_spec("eagle3")      # an unknown name is an error listing the known ones
    spec.tree_class(), spec.export_formats

Adding a family: its files, a `FAMILY_SPECS` tuple in its architecture module, and one line in
`FAMILY_MODULES` (docs/adding-a-family.md). Code outside the package may `register` a spec.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .config_io import ConfigError
from .errors import ExportError
from .spec_registry import SpecRegistry

#: the architecture modules whose `FAMILY_SPECS` the registry holds: one line per family home
FAMILY_MODULES = (
    "draftzoo.architectures.draft_lm",
    "draftzoo.architectures.eagle",
    "draftzoo.architectures.medusa",
    "draftzoo.architectures.mtp",
    "draftzoo.architectures.dflash",
)


class UnknownFamilyError(ConfigError):
    """A family name the registry does not hold."""


@dataclass(frozen=True)
class FamilySpec:
    """Where a family's pieces live and what it can do.

    Dotted references are `"module:attribute"`. `recipe`'s module defines `run(recipe)` and
    `check_recipe(recipe)`; `runtime` is called as `runtime(folder, record, target, tokenizer,
    request)` and returns a `LoadedDrafter` (inference/load.py); each exporter is called as
    `exporter(export)` with an `Export` (architectures/export.py) and fills its folder.
    """

    name: str  # the registry name: recipes' `family:` and records' "family"
    display_name: str  # how cards, tables and messages name it ("EAGLE-3")
    recipe: str  # "module:RecipeClass" of its training recipe
    runtime: str  # "module:function" loading a saved drafter for a target
    exporters: Mapping[str, str] = field(default_factory=dict)  # format -> "module:function"
    recipes_dir: str = ""  # its recipes' folder under recipes/ (default: the name)
    tests: tuple[str, ...] = ()  # the test files that cover it
    #: "module:Class" of the tree kind its proposer drafts besides chains (a `TreeKind`,
    #: inference/proposal_settings.py); "" for a family that drafts chains only
    tree_kind: str = ""
    adapts_target: bool = False  # its checkpoint changes the target (an adapter merged in)
    teacher_forced: bool = False  # `eval --teacher-forced` estimates its chain acceptance
    export_embedding: bool = False  # its exports may carry the target's input embedding
    export_needs_target: bool = False  # every export reads the target's own weights
    #: "module:function" giving the card's lines on how engines serve a drafter folder of the
    #: family (called with the folder; "" when it has none)
    card_notes: str = ""
    #: the peers' layouts it imports: layout name -> "module:function", called with a
    #: `PeerFolder` and the target (`TargetAdapter`); returns an `Imported`, or None when the
    #: files are not that layout (architectures/peer_import.py)
    importers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"a family name is an identifier, got {self.name!r}")
        refs = (self.recipe, self.runtime, *self.exporters.values(), *self.importers.values())
        optional = tuple(ref for ref in (self.card_notes, self.tree_kind) if ref)
        for ref in refs + optional:
            if ref.count(":") != 1:
                raise ValueError(f"family {self.name}: {ref!r} is not 'module:attribute'")
        object.__setattr__(self, "exporters", MappingProxyType(dict(self.exporters)))
        object.__setattr__(self, "importers", MappingProxyType(dict(self.importers)))
        object.__setattr__(self, "recipes_dir", self.recipes_dir or self.name)

    @property
    def export_formats(self) -> tuple[str, ...]:
        """The engine layouts it exports to."""
        return tuple(self.exporters)

    def tree_class(self) -> type | None:
        """The tree kind it drafts, None for chains only."""
        return resolve(self.tree_kind) if self.tree_kind else None

    def recipe_class(self) -> type:
        """Its typed recipe class."""
        return resolve(self.recipe)

    def training_module(self):
        """The module holding `run(recipe)` and `check_recipe(recipe)`."""
        return importlib.import_module(self.recipe.split(":")[0])

    def runtime_loader(self) -> Callable[..., Any]:
        """Its `runtime(folder, record, target, tokenizer, request)`."""
        return resolve(self.runtime)

    def serving_notes(self, folder) -> list[str]:
        """The card's lines on how engines serve the drafter in `folder` (none by default)."""
        return list(resolve(self.card_notes)(folder)) if self.card_notes else []

    def exporter(self, fmt: str) -> Callable[..., Any]:
        """Its exporter for `fmt`; another format is an error naming the ones it has."""
        if fmt not in self.exporters:
            known = ", ".join(self.exporters) or "none"
            raise ExportError(f"a {self.name} drafter exports to: {known} (asked for {fmt!r})")
        return resolve(self.exporters[fmt])


def resolve(reference: str) -> Any:
    """The object a `"module:attribute"` reference names."""
    module_name, attribute = reference.split(":")
    return getattr(importlib.import_module(module_name), attribute)


def _builtin() -> list[FamilySpec]:
    return [spec for name in FAMILY_MODULES for spec in importlib.import_module(name).FAMILY_SPECS]


_FAMILIES = SpecRegistry("drafter family", _builtin, UnknownFamilyError)


def register(spec: FamilySpec) -> FamilySpec:
    """Add `spec` to the registry; a second family of the same name is refused."""
    return _FAMILIES.register(spec)


def unregister(name: str) -> None:
    """Remove a family `register` added (tests, plugins)."""
    _FAMILIES.unregister(name)


def family_specs() -> dict[str, FamilySpec]:
    """Every registered family by name, in registration order."""
    return _FAMILIES.specs()


def family_spec(name: str) -> FamilySpec:
    """The spec of family `name`; an unknown name is an error listing the known ones."""
    return _FAMILIES.spec(name)


def display_name(name: str) -> str:
    """How a family is named to people; a name that is no family (a reference row such as
    prompt lookup) is shown as given."""
    spec = family_specs().get(name)
    return spec.display_name if spec is not None else name
