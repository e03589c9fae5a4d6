"""Proposers that need no trained drafter, registered the way drafter families are.

A model-free proposer is one file defining `MODEL_FREE_SPEC` (a `ModelFreeSpec`: its report
name, the flag that picks it, its settings class and their flags, where its runtime is) and one
line in `MODEL_FREE_MODULES`. `draftzoo generate` and `draftzoo eval` add every registered
proposer's flags; loading, evaluation and the leaderboard read the spec, never the name.

    from draftzoo.inference.model_free import model_free_spec
    runtime = model_free_spec("prompt_lookup").runtime(settings, proposal, tokenizer)
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..architectures.config_io import ConfigError
from ..architectures.families import resolve
from ..architectures.spec_registry import SpecRegistry
from .proposer import ProposerError
from .setting_flag import SettingFlag

#: the modules whose `MODEL_FREE_SPEC` the registry holds: one line per proposer
MODEL_FREE_MODULES = (
    "draftzoo.inference.proposers.prompt_lookup",
    "draftzoo.inference.proposers.suffix_decoding",
)


@dataclass(frozen=True)
class ModelFreeSpec:
    """Where a model-free proposer's pieces live and how it is asked for."""

    name: str  # its family name in reports ("prompt_lookup")
    display_name: str  # how tables and messages name it ("prompt lookup")
    flag: str  # the flag that picks it in `generate` and `eval` ("--prompt-lookup")
    help: str
    settings: str  # "module:Class": its settings (a frozen dataclass with defaults)
    #: "module:function" called as `runtime(settings, proposal, tokenizer)` with its settings,
    #: the `ProposalSettings` asked for and the target's tokenizer; returns a `DrafterRuntime`
    runtime: str
    options: tuple[SettingFlag, ...] = ()
    #: "module:Class" of the tree kind it drafts with --tree ("": chains only)
    tree_kind: str = ""

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    def settings_class(self) -> type:
        return resolve(self.settings)

    def tree_class(self) -> type | None:
        return resolve(self.tree_kind) if self.tree_kind else None

    def settings_from(self, args: argparse.Namespace) -> Any:
        """Its settings from parsed flags (a flag not given keeps the settings' default)."""
        given = {
            o.field: getattr(args, o.dest)
            for o in self.options
            if getattr(args, o.dest, None) is not None
        }
        return self.settings_class()(**given)

    def check(self, proposal) -> None:
        """Refuse a proposal (a `ProposalSettings`) it cannot serve: a tree it does not draft,
        a hybrid (a drafter's)."""
        if proposal.hybrid is not None:
            raise ProposerError(f"a hybrid needs a drafter; {self.flag} is a proposer alone")
        if proposal.drafts_tree and not self.tree_kind:
            raise ProposerError(f"{self.flag} drafts chains only (drop --tree)")

    def build(self, settings: Any, proposal, tokenizer=None):
        """Its `DrafterRuntime` for `proposal` (checked first)."""
        self.check(proposal)
        return resolve(self.runtime)(settings, proposal, tokenizer)


def _builtin() -> list[ModelFreeSpec]:
    specs: list[ModelFreeSpec] = []
    for name in MODEL_FREE_MODULES:
        specs.append(_checked(importlib.import_module(name).MODEL_FREE_SPEC, specs))
    return specs


def _checked(spec: ModelFreeSpec, held) -> ModelFreeSpec:
    """`spec`, after refusing a flag another of `held` picks or options naming no field of its
    settings."""
    if any(h.flag == spec.flag and h.name != spec.name for h in held):
        raise ValueError(f"the flag {spec.flag} already picks another model-free proposer")
    names = {f.name for f in fields(resolve(spec.settings))}
    unknown = [o.field for o in spec.options if o.field not in names]
    if unknown:
        raise ValueError(f"{spec.name}: options set no settings field: {unknown}")
    return spec


_PROPOSERS = SpecRegistry("model-free proposer", _builtin, ConfigError)


def register(spec: ModelFreeSpec) -> ModelFreeSpec:
    """Add `spec`; another proposer of the same name or flag, or options naming no field of
    its settings, are refused."""
    return _PROPOSERS.register(_checked(spec, model_free_specs().values()))


def unregister(name: str) -> None:
    """Remove a proposer `register` added (tests, plugins)."""
    _PROPOSERS.unregister(name)


def model_free_specs() -> dict[str, ModelFreeSpec]:
    """Every registered model-free proposer by name."""
    return _PROPOSERS.specs()


def model_free_spec(name: str) -> ModelFreeSpec:
    return _PROPOSERS.spec(name)


def add_model_free_flags(parser, group, command: str) -> None:
    """Every registered proposer's flag into `group` (a mutually exclusive group: one at most)
    and its options into `parser`, for `command` ("generate" or "eval")."""
    seen: set[str] = set()
    for spec in model_free_specs().values():
        group.add_argument(spec.flag, dest=spec.dest, action="store_true", help=spec.help)
        for option in spec.options:
            if option.flag in seen or (command == "eval" and not option.in_eval):
                continue
            seen.add(option.flag)
            parser.add_argument(option.flag, type=option.parse, dest=option.dest, help=option.help)


def picked(
    args: argparse.Namespace, what: str, shared: Mapping[str, str] | None = None
) -> tuple[ModelFreeSpec, Any] | None:
    """The proposer the flags picked and its settings, or None. An option of a proposer that
    was not picked is refused, unless `shared` maps that proposer's name to another flag that
    reads its options and was given (a hybrid reads suffix decoding's)."""
    chosen = None
    for spec in model_free_specs().values():
        if getattr(args, spec.dest, False):
            chosen = spec
            continue
        given = [o.flag for o in spec.options if getattr(args, o.dest, None) is not None]
        reader = (shared or {}).get(spec.name)
        if given and not (reader and getattr(args, reader[2:].replace("-", "_"), False)):
            verb = "sets" if len(given) == 1 else "set"
            add = f"{spec.flag} or {reader}" if reader else spec.flag
            raise ConfigError(f"{what}: {', '.join(given)} {verb} {spec.display_name}: add {add}")
    return None if chosen is None else (chosen, chosen.settings_from(args))
