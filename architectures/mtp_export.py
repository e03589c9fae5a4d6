"""MTP modules -> a checkpoint vLLM serves with its MTP path (`method: deepseek_mtp`).

vLLM loads MTP modules from the target's own checkpoint: `model.layers.{N+k}.*` beside the N
decoder layers, counted by the config's `num_nextn_predict_layers`, each module with its own
copy of the embedding and head (`deepseek_mtp.py`). The export is therefore the target's
checkpoint (its shards hard-linked where the filesystem allows, else copied) plus
`model-mtp.safetensors` and an index naming both:

    vllm serve <export> \
        --speculative-config '{"method": "deepseek_mtp", "num_speculative_tokens": 1}'

Only DeepSeek-style targets have that path; for any other target the export is refused (the
modules then serve with draftzoo's runtime), never written as a folder no engine loads.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .checkpoint_files import INDEX_FILE, checkpoint_files
from .errors import ExportError
from .export import Export
from .mtp_native import to_deepseek_layout

#: target model types whose vLLM model reads `model.layers.{N+k}` MTP modules
VLLM_MTP_TARGETS = ("deepseek_v3", "deepseek_v2", "glm4_moe")
MTP_FILE = "model-mtp.safetensors"


def check_servable(model_type: str) -> None:
    """Refuse a target whose MTP modules no engine serves."""
    if model_type not in VLLM_MTP_TARGETS:
        raise ExportError(
            f"vLLM serves MTP modules only inside DeepSeek-style targets "
            f"({', '.join(VLLM_MTP_TARGETS)}); this drafter's target is {model_type!r}, whose "
            "MTP modules no engine loads: serve them with draftzoo's runtime (draftzoo.load)"
        )


def export_vllm(export: Export) -> None:
    """MTP modules -> the target's checkpoint plus the modules (the family's exporter)."""
    export_mtp(export.source, export.folder, Path(export.target_location()), export.tensors())


def export_mtp(drafter_dir: Path, out: Path, target_dir: Path, tensors: dict) -> None:
    """Write the target's checkpoint plus the modules in vLLM's layout into `out`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    config = json.loads((drafter_dir / "config.json").read_text())
    check_servable(config["target_config"]["model_type"])
    if not Path(target_dir).is_dir():
        raise ExportError(
            f"the MTP export needs the target's checkpoint folder; {target_dir} is not one"
        )
    files = checkpoint_files(target_dir)
    shared = {}
    for name, key in (("embed", "model.embed_tokens.weight"), ("head", "lm_head.weight")):
        if key not in files:
            raise ExportError(f"{target_dir}: no {key} to give each MTP module its copy of")
        with safe_open(str(files[key]), framework="pt") as handle:
            shared[name] = handle.get_tensor(key)
    num_layers = config["num_target_layers"]
    mtp = to_deepseek_layout(tensors, num_layers, shared["embed"], shared["head"])
    dtype = shared["embed"].dtype
    save_file(_unshared(mtp, dtype), str(out / MTP_FILE), metadata={"format": "pt"})
    for file in sorted(set(files.values())):
        keys = [k for k, f in files.items() if f == file]
        if any(_is_mtp_key(k, num_layers) for k in keys):
            _copy_without_mtp(file, out / file.name, keys, num_layers)
        else:
            _link_or_copy(file, out / file.name)
    weight_map = {k: f.name for k, f in files.items() if not _is_mtp_key(k, num_layers)}
    weight_map.update(dict.fromkeys(mtp, MTP_FILE))
    (out / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    target_config = json.loads((Path(target_dir) / "config.json").read_text())
    target_config["num_nextn_predict_layers"] = config["num_nextn_predict_layers"]
    target_config["draftzoo"] = {"family": "mtp"}
    (out / "config.json").write_text(json.dumps(target_config, indent=1))


def _is_mtp_key(key: str, num_layers: int) -> bool:
    """A key of a module the target's checkpoint already ships (replaced by the export's)."""
    parts = key.split(".")
    return key.startswith("model.layers.") and int(parts[2]) >= num_layers


def _copy_without_mtp(source: Path, dest: Path, keys: list[str], num_layers: int) -> None:
    """A shard rewritten without the modules the target shipped (the export's replace them:
    an engine reading both would load whichever came last)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(source), framework="pt") as handle:
        kept = {k: handle.get_tensor(k) for k in keys if not _is_mtp_key(k, num_layers)}
    save_file(kept, str(dest), metadata={"format": "pt"})


def _link_or_copy(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


def _unshared(tensors: dict, dtype) -> dict:
    """`tensors` in `dtype` (floats), each with storage of its own: every module holds its
    copy of the embedding and head in the layout, which safetensors writes only unshared."""
    seen: set[int] = set()
    out = {}
    for key, tensor in tensors.items():
        tensor = (tensor.to(dtype) if tensor.is_floating_point() else tensor).contiguous()
        if tensor.untyped_storage().data_ptr() in seen:
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        out[key] = tensor
    return out
