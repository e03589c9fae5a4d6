"""The explicit registry of drafter families: recipe YAML -> typed recipe -> its `run`.

A recipe names its family in its top-level `family:` key. An unknown family is an error that
lists the known ones; nothing falls back to a default. Each family's training module defines
its recipe class, `run(recipe)` and `check_recipe(recipe)` (the meta-device check).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from ..architectures.config_io import ConfigError, from_dict, read_yaml

#: family -> (training module, recipe class)
FAMILIES: dict[str, tuple[str, str]] = {
    "draft_lm": ("draftzoo.train.draft_lm", "DraftLMRecipe"),
    "eagle1": ("draftzoo.train.eagle", "EagleRecipe"),
    "eagle3": ("draftzoo.train.eagle", "EagleRecipe"),
    "medusa1": ("draftzoo.train.medusa", "MedusaRecipe"),
    "medusa2": ("draftzoo.train.medusa2", "Medusa2Recipe"),
    "mtp": ("draftzoo.train.mtp", "MtpRecipe"),
}


def _family(name: str):
    """(training module, recipe class) of a family."""
    if name not in FAMILIES:
        raise ConfigError(f"unknown drafter family {name!r}; known: {', '.join(sorted(FAMILIES))}")
    module_name, recipe_class = FAMILIES[name]
    module = importlib.import_module(module_name)
    return module, getattr(module, recipe_class)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`section.key=value` overrides (values parsed as YAML) applied to recipe data."""
    import yaml

    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form section.key=value")
        dotted, raw = item.split("=", 1)
        *parents, leaf = dotted.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
        try:
            node[leaf] = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: the value is not valid YAML") from err
    return data


def load_recipe(path: Path, overrides: list[str] = ()):
    """A recipe file (plus overrides) as its family's typed recipe."""
    path = Path(path)
    data = read_yaml(path, "recipe")
    if "family" not in data:
        raise ConfigError(f"{path}: a recipe is a mapping with a top-level 'family' key")
    data = apply_overrides(data, list(overrides))
    _, recipe_class = _family(data["family"])
    try:
        return from_dict(recipe_class, data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err


def run_recipe(recipe):
    """Train `recipe` with its family's loop."""
    module, _ = _family(recipe.family)
    return module.run(recipe)


def check_recipe(recipe) -> dict:
    """Build `recipe`'s target and drafter on the meta device (no weights); a summary."""
    module, _ = _family(recipe.family)
    return module.check_recipe(recipe)
