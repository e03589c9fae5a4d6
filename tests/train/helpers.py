"""Small real training inputs: chat rows mined from stdlib files, recipes on testbed-tiny."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

from draftzoo.architectures.config_io import from_dict
from draftzoo.data.chat_pairs import iter_function_pairs
from draftzoo.train.draft_lm import DraftLMRecipe

STDLIB_FILES = ("textwrap.py", "json/decoder.py", "shlex.py", "fractions.py", "calendar.py")


def write_chat_jsonl(path: Path, limit: int = 48) -> Path:
    """OpenAI-messages rows of documented stdlib functions (real text, nothing invented)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    rows = []
    for name in STDLIB_FILES:
        for pair in iter_function_pairs((root / name).read_text()):
            rows.append({"messages": pair.as_messages()})
    rows = rows[:limit]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


#: the loop of every tiny test recipe: 2 steps, a checkpoint after each, full precision
TINY_TRAIN = {
    "seed": 0,
    "micro_batch_size": 4,
    "max_steps": 2,
    "warmup_steps": 1,
    "lr": 1e-3,
    "mixed_precision": "no",
    "checkpoint_every": 1,
    "log_every": 1,
    "loss_chunk_rows": 64,  # every family's loss runs chunked in the tests (up to 512 rows)
}


def _override(data: dict, sections: dict) -> None:
    """Merge dict sections into recipe data (other values replace)."""
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value


def launch_two_processes(recipe_path: Path, launch_config: str = "ddp.yaml"):
    """`accelerate launch` the recipe on 2 CPU processes over gloo (DDP, or another of
    recipes/launch/); the finished process."""
    import os
    import subprocess
    import sys

    launch = Path(__file__).parents[2] / "recipes" / "launch" / launch_config
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(launch),
            "--num_processes",
            "2",
            "-m",
            "draftzoo",
            "train",
            str(recipe_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _tiny(
    recipe_class,
    family: str,
    tmp_path: Path,
    target_dir: Path,
    data_file: Path,
    own: dict,
    sections: dict,
    packing: bool = False,
    **data_fields,
):
    """A `family` recipe for testbed-tiny: the tiny loop, 128-token rows, the family's `own`
    sections, then `sections` over it all."""
    data = {
        "family": family,
        "name": "test",
        "output_dir": str(tmp_path / "drafter"),
        "cache_dir": str(tmp_path / "cache"),
        "target": {"path": str(target_dir)},
        "data": {"source": str(data_file), "max_length": 128, "packing": packing, **data_fields},
        **own,
        "train": dict(TINY_TRAIN),
    }
    _override(data, sections)
    return from_dict(recipe_class, data)


def tiny_recipe(tmp_path: Path, target_dir: Path, data_file: Path, **sections) -> DraftLMRecipe:
    """A draft-LM recipe for testbed-tiny; `sections` override whole recipe sections."""
    draft = {
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
    }
    return _tiny(
        DraftLMRecipe, "draft_lm", tmp_path, target_dir, data_file, {"draft": draft}, sections
    )


def recipe_yaml(recipe: DraftLMRecipe, path: Path) -> Path:
    """Write a recipe back to YAML (what a user would launch)."""
    import yaml

    from draftzoo.architectures.config_io import to_dict

    path.write_text(yaml.safe_dump(to_dict(recipe)))
    return path


def tiny_eagle_recipe(tmp_path: Path, target_dir: Path, data_file: Path, **sections):
    """An EAGLE recipe (family from `eagle.kind`, default eagle3) for testbed-tiny."""
    from draftzoo.train.eagle import EagleRecipe

    kind = sections.get("eagle", {}).get("kind", "eagle3")
    # testbed-tiny has 2 layers: EAGLE-3's default taps (2, N//2, N-3) need N >= 3
    eagle = (
        {"kind": kind, "ttt_steps": 3, "layers": [0, 1, 2]}
        if kind == "eagle3"
        else {"kind": kind, "ttt_steps": 1}
    )
    return _tiny(EagleRecipe, kind, tmp_path, target_dir, data_file, {"eagle": eagle}, sections)


def tiny_medusa2_recipe(tmp_path: Path, target_dir: Path, data_file: Path, **sections):
    """A Medusa-2 recipe (3 heads, a rank-4 LoRA, 4 held-out rows) for testbed-tiny."""
    from draftzoo.train.medusa2 import Medusa2Recipe

    own = {
        "medusa": {"num_heads": 3},
        "lora": {"rank": 4, "alpha": 8},
        "loss": {"ramp_steps": 2},
        "calibration": {"nodes": 6, "ranks": 3},
    }
    return _tiny(
        Medusa2Recipe,
        "medusa2",
        tmp_path,
        target_dir,
        data_file,
        own,
        sections,
        packing=True,
        heldout_rows=4,
    )


def tiny_medusa_recipe(tmp_path: Path, target_dir: Path, data_file: Path, **sections):
    """A Medusa-1 recipe (3 heads, packed rows) for testbed-tiny."""
    from draftzoo.train.medusa import MedusaRecipe

    own = {"medusa": {"num_heads": 3}}
    return _tiny(
        MedusaRecipe, "medusa1", tmp_path, target_dir, data_file, own, sections, packing=True
    )


def tiny_mtp_recipe(tmp_path: Path, target_dir: Path, data_file: Path, **sections):
    """An MTP recipe (one module unless `mtp` says otherwise) for testbed-tiny."""
    from draftzoo.train.mtp import MtpRecipe

    own = {"mtp": {"depth": 1}}
    return _tiny(MtpRecipe, "mtp", tmp_path, target_dir, data_file, own, sections)


def tiny_dflash_recipe(tmp_path: Path, target_dir: Path, data_file: Path, **sections):
    """A DFlash recipe (blocks of 4, one layer, 8 blocks a row) for testbed-tiny."""
    from draftzoo.train.dflash import DflashRecipe

    own = {"dflash": {"block_size": 4, "mask_token_id": 0, "anchors_per_row": 8}}
    return _tiny(DflashRecipe, "dflash", tmp_path, target_dir, data_file, own, sections)
