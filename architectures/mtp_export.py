"""MTP modules -> a checkpoint vLLM (`deepseek_mtp`) or SGLang (`deepseek_nextn`) serves.

Both engines load MTP modules from the target's own checkpoint: `model.layers.{N+k}.*` beside
the N decoder layers, counted by the config's `num_nextn_predict_layers`, each module with its
own copy of the embedding and head. The export is therefore the target's checkpoint (its
shards hard-linked where the filesystem allows, else copied) plus `model-mtp.safetensors` and
an index naming both:

    vllm serve <export> \
        --speculative-config '{"method": "deepseek_mtp", "num_speculative_tokens": 1}'
    python -m sglang.launch_server --model-path <export> --speculative-algorithm EAGLE \
        --speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2

The files are the same; the engines draft differently from them (architectures/mtp.py): vLLM
hands over the pre-norm residual, zeroes position 0's embedding and runs the first module at
every step (`hand_over: residual`), SGLang hands over the post-norm state and loads one module
(`hand_over: normed`, depth 1). Each format is written only for a drafter trained in its
engine's convention, so the engine drafts what draftzoo measured. Only DeepSeek-style targets
have that path; for any other target the export is refused (the modules then serve with
draftzoo's runtime), never written as a folder no engine loads.
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
            f"vLLM and SGLang serve MTP modules only inside DeepSeek-style targets "
            f"({', '.join(VLLM_MTP_TARGETS)}); this drafter's target is {model_type!r}, whose "
            "MTP modules no engine loads: serve them with draftzoo's runtime (draftzoo.load)"
        )


#: what each engine runs: (hand-over, how many modules it drafts with), as its code reads
ENGINE_CONVENTIONS = {
    "vllm": ("residual", "its first module at every draft step"),
    "sglang": ("normed", "one module (`num_nextn_predict_layers` must be 1)"),
}


def check_convention(config: dict, fmt: str) -> None:
    """Refuse an export the engine would draft differently from what draftzoo measured."""
    hand_over = config.get("mtp_hand_over", "normed")
    depth = config["num_nextn_predict_layers"]
    wanted, modules = ENGINE_CONVENTIONS[fmt]
    if hand_over != wanted:
        other = next(f for f, (h, _) in ENGINE_CONVENTIONS.items() if h == hand_over)
        raise ExportError(
            f"this MTP drafter was trained with mtp.hand_over: {hand_over}, {fmt} drafts with "
            f"{wanted} (docs/mtp.md), so it would propose other tokens than the ones measured "
            f"here: export --format {other}, or retrain with mtp.hand_over: {wanted}"
        )
    if fmt == "sglang" and depth != 1:
        raise ExportError(
            f"SGLang's deepseek_nextn serves {modules}; this drafter has {depth} modules, "
            "which only draftzoo's runtime drafts with as measured"
        )


def serving_note(config: dict) -> str:
    """Which engine drafts what draftzoo measured for a drafter with this config.json."""
    hand_over = config.get("mtp_hand_over", "normed")
    depth = config["num_nextn_predict_layers"]
    model_type = config["target_config"]["model_type"]
    said = f"Hand-over `{hand_over}`, {depth} module{'s' if depth > 1 else ''}. "
    if model_type not in VLLM_MTP_TARGETS:
        return said + (
            f"vLLM and SGLang serve MTP modules only inside DeepSeek-style targets; this "
            f"target is {model_type!r}, so draftzoo's runtime serves it."
        )
    if hand_over == "residual":
        return said + (
            "vLLM (`deepseek_mtp`, `draftzoo export --format vllm`) drafts what was measured "
            "here; SGLang hands over the post-norm state and would draft other tokens."
        )
    if depth == 1:
        return said + (
            "SGLang (`deepseek_nextn`, `draftzoo export --format sglang`) drafts what was "
            "measured here; vLLM hands over the pre-norm residual and zeroes position 0's "
            "embedding, so it would draft other tokens (its export is refused)."
        )
    return said + (
        "No engine drafts what was measured here: vLLM runs its first module at every step "
        "with the residual hand-over, SGLang loads one module; draftzoo's runtime serves it."
    )


def card_notes(folder: Path) -> list[str]:
    """The family's card lines (`FamilySpec.card_notes`)."""
    return [serving_note(json.loads((Path(folder) / "config.json").read_text()))]


def export_vllm(export: Export) -> None:
    """MTP modules -> the target's checkpoint plus the modules, for vLLM's deepseek_mtp."""
    _export_for(export, "vllm")


def export_sglang(export: Export) -> None:
    """MTP modules -> the target's checkpoint plus the module, for SGLang's deepseek_nextn."""
    _export_for(export, "sglang")


def _export_for(export: Export, fmt: str) -> None:
    check_servable(export.config["target_config"]["model_type"])
    check_convention(export.config, fmt)
    tensors = export.whole_vocabulary_tensors()
    export_mtp(export.source, export.folder, Path(export.target_location()), tensors)
    note = export.draft_vocabulary_note()
    if note:
        config = json.loads((export.folder / "config.json").read_text())
        config["draftzoo"]["draft_vocabulary"] = note
        (export.folder / "config.json").write_text(json.dumps(config, indent=1))


def export_mtp(drafter_dir: Path, out: Path, target_dir: Path, tensors: dict) -> None:
    """Write the target's checkpoint plus the modules in the engines' layout into `out` (any
    hand-over and depth: the format's exporter checks those)."""
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
    target_config["draftzoo"] = {"family": "mtp", "mtp_hand_over": config.get("mtp_hand_over")}
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
