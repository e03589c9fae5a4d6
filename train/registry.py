"""The explicit registry of drafter families: recipe YAML -> typed recipe -> its `run`.

A recipe names its family in its top-level `family:` key. An unknown family is an error that
lists the known ones; nothing falls back to a default.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from ..architectures.config_io import ConfigError, from_dict

#: family -> (module, recipe class, run function)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "draft_lm": ("draftzoo.train.draft_lm", "DraftLMRecipe", "run"),
    "eagle1": ("draftzoo.train.eagle", "EagleRecipe", "run"),
    "eagle3": ("draftzoo.train.eagle", "EagleRecipe", "run"),
}


def _family(name: str):
    if name not in FAMILIES:
        raise ConfigError(f"unknown drafter family {name!r}; known: {', '.join(sorted(FAMILIES))}")
    module_name, recipe_class, run_name = FAMILIES[name]
    module = importlib.import_module(module_name)
    return getattr(module, recipe_class), getattr(module, run_name)


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
        node[leaf] = yaml.safe_load(raw)
    return data


def load_recipe(path: Path, overrides: list[str] = ()):
    """A recipe file (plus overrides) as its family's typed recipe."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"recipe not found: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or "family" not in data:
        raise ConfigError(f"{path}: a recipe is a mapping with a top-level 'family' key")
    data = apply_overrides(data, list(overrides))
    recipe_class, _ = _family(data["family"])
    try:
        return from_dict(recipe_class, data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err


def run_recipe(recipe):
    """Train `recipe` with its family's loop."""
    _, run = _family(recipe.family)
    return run(recipe)
