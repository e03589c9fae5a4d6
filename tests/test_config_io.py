from dataclasses import dataclass, field

import pytest

from draftzoo.architectures.config_io import ConfigError, from_dict, load_yaml_config, to_dict
from draftzoo.architectures.defaults import recipes_dir
from draftzoo.train.testbed import load_testbed_config
from draftzoo.train.testbed_config import TestbedConfig


@dataclass(frozen=True)
class Inner:
    rate: float = 1.0
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Outer:
    steps: int = 1
    inner: Inner = field(default_factory=Inner)
    label: str | None = None


def test_nested_dataclass_from_dict_converts_types():
    config = from_dict(Outer, {"steps": 3, "inner": {"rate": 2, "names": ["a", "b"]}})
    assert config == Outer(steps=3, inner=Inner(rate=2.0, names=("a", "b")))
    assert to_dict(config) == {
        "steps": 3,
        "inner": {"rate": 2.0, "names": ["a", "b"]},
        "label": None,
    }


def test_unknown_key_is_rejected_with_its_path():
    with pytest.raises(ConfigError, match=r"inner: unknown key\(s\) \['rte'\]"):
        from_dict(Outer, {"inner": {"rte": 2}})


def test_wrong_scalar_type_is_rejected():
    with pytest.raises(ConfigError, match="steps: expected int"):
        from_dict(Outer, {"steps": "3"})


def test_exponent_floats_that_pyyaml_reads_as_strings_are_floats():
    """`--set train.lr=1e-3` and `lr: 3e-4`: YAML 1.2 floats that PyYAML leaves as strings."""
    import yaml

    assert yaml.safe_load("lr: 1e-3") == {"lr": "1e-3"}
    for text, value in (("1e-3", 1e-3), ("5E+4", 5e4), ("-2.5e-1", -0.25), (".5e1", 5.0)):
        assert from_dict(Inner, {"rate": text}).rate == value
    for text in ("1e", "e-3", "fast", "1.0"):  # not an exponent literal: still refused
        with pytest.raises(ConfigError, match="rate: expected float"):
            from_dict(Inner, {"rate": text})


def test_every_shipped_recipe_path_loads():
    recipes = sorted((recipes_dir() / "testbed").glob("*.yaml"))
    assert {p.stem for p in recipes} == {"testbed-tiny", "testbed-small"}
    for path in recipes:
        config = load_yaml_config(TestbedConfig, path)
        assert config.name == path.stem


def test_small_recipe_meets_the_size_contract():
    config = load_testbed_config("small")
    assert config.model.num_hidden_layers >= 10
    assert 8000 <= config.tokenizer.vocab_size <= 8192


def test_contradictory_recipe_is_rejected(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  max_steps: 10\n  warmup_steps: 20\n")
    with pytest.raises(ConfigError, match="warmup_steps must be < max_steps"):
        load_yaml_config(TestbedConfig, path)
