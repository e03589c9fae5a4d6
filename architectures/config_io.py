"""Strict typed configs: YAML or dicts -> frozen dataclasses, unknown keys rejected."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from .errors import DraftzooError

T = TypeVar("T")


#: a number YAML 1.2 reads as a float and PyYAML (YAML 1.1) leaves a string: 1e-3, 5E+4
YAML12_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


class ConfigError(DraftzooError, ValueError):
    """A config file or dict does not match its dataclass."""


#: seeds: torch takes a signed 64-bit integer, and offsets are added to some (eval's prompts)
SEED_LIMIT = 2**62


def check_seed(
    seed: Any, name: str = "seed", error: type[Exception] = ValueError, limit: int = SEED_LIMIT
) -> None:
    """Refuse a seed that is not an integer in [0, `limit`) (a power of two), in one line."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < limit:
        power = limit.bit_length() - 1
        raise error(f"{name} must be in [0, 2**{power}), an integer; got {seed!r}")


def _convert(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        return from_dict(annotation, value, where)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(value, inner[0], where)
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        item_type = args[0] if args else Any
        return tuple(_convert(v, item_type, f"{where}[{i}]") for i, v in enumerate(value))
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is float and isinstance(value, str) and YAML12_FLOAT.fullmatch(value):
        return float(value)  # 1e-3: a float in YAML 1.2, a string to PyYAML's 1.1 rules
    if annotation is Path and isinstance(value, str):
        return Path(value)
    if annotation in (int, float, str, bool) and not isinstance(value, annotation):
        raise ConfigError(f"{where}: expected {annotation.__name__}, got {value!r}")
    if annotation is int and isinstance(value, bool):
        raise ConfigError(f"{where}: expected int, got {value!r}")
    return value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build dataclass `cls` from `data`, refusing unknown keys and wrong scalar types."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        prefix = f"{where}: " if where else ""
        raise ConfigError(
            f"{prefix}unknown key(s) {unknown} for {cls.__name__}; known: {sorted(fields)}"
        )
    kwargs = {
        name: _convert(value, hints[name], f"{where}.{name}" if where else name)
        for name, value in data.items()
    }
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where or cls.__name__}: {err}") from err


def to_dict(config: Any) -> dict[str, Any]:
    """A dataclass config as plain YAML/JSON-friendly data."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        if isinstance(value, Path):
            return str(value)
        return value

    return plain(config)


def read_yaml(path: Path, what: str = "config file") -> dict[str, Any]:
    """A YAML file's top-level mapping; a missing file, bad YAML or another shape is a
    `ConfigError` naming the file."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(err).split())})") from err
    if data is None:
        raise ConfigError(f"{path}: the {what} is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return data


def load_yaml_config(cls: type[T], path: Path) -> T:
    """Read a YAML file into dataclass `cls` strictly."""
    data = read_yaml(path)
    try:
        return from_dict(cls, data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err
