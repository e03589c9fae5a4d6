"""Every shipped recipe loads strictly and fits its target on the meta device."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from draftzoo.architectures.target import TargetError
from draftzoo.train.draft_lm import check_on_meta
from draftzoo.train.registry import load_recipe
from draftzoo.train.setup import model_config

RECIPES = Path(__file__).parents[2] / "recipes"


@pytest.mark.parametrize(
    "path", sorted((RECIPES / "draft_lm").glob("*.yaml")), ids=lambda p: p.name
)
def test_shipped_draft_lm_recipes_validate_on_meta(path):
    recipe = load_recipe(path)
    draft_config = model_config(recipe.draft.init_from) if recipe.draft.init_from else None
    summary = check_on_meta(recipe, model_config(recipe.target.path), draft_config)
    assert summary["draft_parameters"] < summary["target_parameters"]


def test_real_pair_has_the_published_sizes():
    recipe = load_recipe(RECIPES / "draft_lm" / "llama-3.1-8b-instruct.yaml")
    summary = check_on_meta(
        recipe, model_config(recipe.target.path), model_config(recipe.draft.init_from)
    )
    assert summary["target_parameters"] == 8_030_261_248  # Llama-3.1-8B
    assert summary["draft_parameters"] == 1_235_814_400  # Llama-3.2-1B (tied embeddings)
    assert summary["vocab_size"] == 128_256


def test_meta_check_refuses_a_draft_with_another_vocabulary():
    recipe = load_recipe(RECIPES / "draft_lm" / "llama-3.1-8b-instruct.yaml")
    other = model_config(recipe.draft.init_from)
    other.vocab_size = 32_000
    with pytest.raises(TargetError, match="draft vocabulary 32000 != target vocabulary 128256"):
        check_on_meta(recipe, model_config(recipe.target.path), other)


@pytest.mark.parametrize("path", sorted((RECIPES / "launch").glob("*.yaml")), ids=lambda p: p.name)
def test_launch_configs_name_a_topology_and_no_hyperparameters(path):
    config = yaml.safe_load(path.read_text())
    assert config["distributed_type"] in ("NO", "MULTI_GPU", "DEEPSPEED", "FSDP")
    assert config["mixed_precision"] == "no"  # precision belongs to the recipe
    assert not {"lr", "max_steps", "seed"} & set(config)


@pytest.mark.parametrize(
    "path",
    sorted([*(RECIPES / "eagle1").glob("*.yaml"), *(RECIPES / "eagle3").glob("*.yaml")]),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_shipped_eagle_recipes_validate_on_meta(path):
    from draftzoo.train.eagle import check_on_meta as check_eagle

    recipe = load_recipe(path)
    summary = check_eagle(recipe, model_config(recipe.target.path))
    n = summary["target_layers"]
    expected = [n] if recipe.family == "eagle1" else [2, n // 2, n - 3]
    assert summary["hidden_state_layers"] == expected
    assert summary["drafter_parameters"] < summary["target_parameters"] / 4


def test_real_eagle3_drafters_have_the_published_shapes():
    from draftzoo.train.eagle import check_on_meta as check_eagle

    llama = load_recipe(RECIPES / "eagle3" / "llama-3.1-8b-instruct.yaml")
    summary = check_eagle(llama, model_config(llama.target.path))
    # fc 3h->h, q/k/v over 2h, o, MLP, lm_head over 32k draft tokens (h 4096, 14336 MLP)
    assert summary["drafter_parameters"] == 424_689_664
    assert summary["hidden_state_layers"] == [2, 16, 29]
    qwen = load_recipe(RECIPES / "eagle3" / "qwen3-8b.yaml")
    assert check_eagle(qwen, model_config(qwen.target.path))["hidden_state_layers"] == [2, 18, 33]


@pytest.mark.parametrize("path", sorted((RECIPES / "medusa1").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_medusa_recipes_validate_on_meta(path):
    from draftzoo.train.registry import check_recipe

    recipe = load_recipe(path)
    summary = check_recipe(recipe)
    assert summary["num_heads"] == recipe.medusa.num_heads
    # each head: a residual block (h x h + h) and its own h x V projection
    config = model_config(recipe.target.path)
    # the projection covers the draft vocabulary (vLLM's truncated_vocab_size) when one is set
    h, v = config.hidden_size, recipe.medusa.draft_vocab_size or config.vocab_size
    assert summary["head_parameters"] == recipe.medusa.num_heads * (h * h + h + h * v)


@pytest.mark.parametrize("path", sorted((RECIPES / "medusa2").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_medusa2_recipes_validate_on_meta(path):
    from draftzoo.train.registry import check_recipe

    recipe = load_recipe(path)
    summary = check_recipe(recipe)
    config = model_config(recipe.target.path)
    h, layers = config.hidden_size, config.num_hidden_layers
    v = recipe.medusa.draft_vocab_size or config.vocab_size
    assert summary["head_parameters"] == recipe.medusa.num_heads * (h * h + h + h * v)
    # LoRA on q, k, v, o, gate, up, down of every layer: r x (in + out) each
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    i = config.intermediate_size
    per_layer = (h + h) + (h + kv) + (h + kv) + (h + h) + 2 * (h + i) + (i + h)
    assert summary["lora_parameters"] == recipe.lora.rank * per_layer * layers
