"""Recipe YAML -> typed recipe -> its family's `run`, through the family registry.

A recipe names its family in its top-level `family:` key; the family's `FamilySpec`
(architectures/families.py) names its recipe class, whose module defines `run(recipe)` and
`check_recipe(recipe)` (the meta-device check). An unknown family is an error that lists the
known ones; nothing falls back to a default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..architectures.config_io import ConfigError, from_dict, read_yaml
from ..architectures.families import family_spec


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
    recipe_class = family_spec(str(data["family"])).recipe_class()
    try:
        return from_dict(recipe_class, data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err


def run_recipe(recipe):
    """Train `recipe` with its family's loop."""
    return family_spec(recipe.family).training_module().run(recipe)


def check_recipe(recipe) -> dict:
    """Build `recipe`'s target and drafter on the meta device (no weights); a summary."""
    return family_spec(recipe.family).training_module().check_recipe(recipe)
