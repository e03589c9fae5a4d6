"""Exporters: a draftzoo drafter folder -> the checkpoint layout an engine loads.

    draftzoo export DRAFTER --format vllm --output-dir exports/eagle3-vllm

| family | format        | architectures                 | weights                              |
|--------|---------------|-------------------------------|--------------------------------------|
| eagle3 | `vllm`        | LlamaForCausalLMEagle3        | fc, midlayer.*, norm, lm_head, d2t, t2d |
| eagle3 | `sglang`      | LlamaForCausalLMEagle3        | the same                             |
| eagle3 | `speculators` | Eagle3Speculator              | layers.0.* for midlayer.*; embed_tokens |
| eagle1 | `vllm`        | EagleLlamaForCausalLM         | fc, layers.0.* (no input norm)       |
| draft_lm | `hf`        | the draft LM's own (plain transformers checkpoint) |             |
| medusa1/2 | `vllm`     | MedusaModel                   | blocks.{h}.layers.{l}.*, lm_heads.{h} |
| medusa1/2 | `medusa`   | Medusa's reference layout     | {h}.{l}.linear.*, {h}.{L}.weight     |
| mtp    | `vllm`        | the target's (DeepSeek-style) | target + model.layers.{N+k}.*       |

EAGLE-3 shares the target's input embedding. `embed_tokens` (the target's own tensor, as its
checkpoint stores it) is written where the peer's own exporter writes it: `speculators` (its
`save_pretrained` does; its loader fills a missing one with zeros, not from the verifier),
not `sglang`/`vllm` (SpecForge's `to_sglang` drops it; the engines take the target's).
`embed_tokens=True` adds it to those too: SpecForge's strict warm start then loads the folder.
Formats that name the target record a verifier a loader finds from any working directory:
the hub id of a hub target, the absolute path of a local one.

The `medusa` format is the reference code's `medusa_lm_head.safetensors` (TGI and
TensorRT-LLM read it too).

A Medusa-2 export also writes the adapted target, the base with its LoRA merged, to
`<output>/target/` (a plain transformers checkpoint): serve the heads with *that* target.
The reference layout repeats one residual block per head (`[ResBlock] * n`), so it holds
heads of one layer only; deeper heads export to `vllm`.

vLLM reads a Medusa config by renaming every key that contains "num" and "heads" to
`num_heads` and every key with "num" and "layers" to `num_hidden_layers`, so the Medusa export
writes no other `num_*` key.

Hidden-state layer ids: draftzoo stores HF indices (k = input to decoder layer k). vLLM's
top-level `eagle_aux_hidden_state_layer_ids` uses the same convention; SGLang's nested
`eagle_config.eagle_aux_hidden_state_layer_ids` counts outputs of layers (k - 1). Engines drop
weight names they do not know without a word, so the tests hold every export to the engine's
own parameter list, key for key, shape for shape, dtype for dtype.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .drafter_io import (
    check_replaceable,
    output_path,
    read_drafter_record,
    read_drafter_weights,
    replace_dir,
)
from .errors import ExportError

#: formats that carry the target's input embedding unless told otherwise
EMBEDDING_BY_DEFAULT = ("speculators",)
FORMATS = {
    "eagle3": ("vllm", "sglang", "speculators"),
    "eagle1": ("vllm",),
    "draft_lm": ("hf",),
    "medusa1": ("vllm", "medusa"),
    "medusa2": ("vllm", "medusa"),
    "mtp": ("vllm",),
}
#: the Medusa reference code's weights file
MEDUSA_HEADS_FILE = "medusa_lm_head.safetensors"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def _llama_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The transformers LlamaConfig fields of a drafter's decoder layer."""
    rope = config.get("rope_parameters") or {}
    return {
        "model_type": "llama",
        "hidden_size": config["hidden_size"],
        "intermediate_size": config["intermediate_size"],
        "num_attention_heads": config["num_attention_heads"],
        "num_key_value_heads": config["num_key_value_heads"],
        "head_dim": config["head_dim"],
        "num_hidden_layers": 1,
        "hidden_act": config["hidden_act"],
        "rms_norm_eps": config["rms_norm_eps"],
        "max_position_embeddings": config["max_position_embeddings"],
        "rope_theta": rope.get("rope_theta", 10000.0),
        "rope_scaling": None if rope.get("rope_type", "default") == "default" else dict(rope),
        "vocab_size": config["vocab_size"],
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }


def _dtype_name(tensors: dict[str, torch.Tensor]) -> str:
    floating = [t.dtype for t in tensors.values() if t.is_floating_point()]
    return str(floating[0]).removeprefix("torch.") if floating else "float32"


def vllm_layer_ids(hf_indices: list[int], num_layers: int) -> list[int]:
    """HF indices -> vLLM's ids (the same: input to layer k); only inputs of real layers."""
    if any(not 0 <= k < num_layers for k in hf_indices):
        raise ExportError(
            f"engines capture inputs of decoder layers 0..{num_layers - 1}; HF indices "
            f"{hf_indices} include one outside (index {num_layers} is the final norm output)"
        )
    return list(hf_indices)


def sglang_layer_ids(hf_indices: list[int], num_layers: int) -> list[int]:
    """HF indices (input to layer k) -> SGLang's ids (output of layer k - 1)."""
    vllm_layer_ids(hf_indices, num_layers)
    if any(k < 1 for k in hf_indices):
        raise ExportError(
            f"SGLang counts layer outputs, so HF index 0 (the embeddings) has no id there: "
            f"{hf_indices}"
        )
    return [k - 1 for k in hf_indices]


def _check_positions(config: dict[str, Any], target_config) -> None:
    if target_config is None:
        return
    if "medusa_num_heads" in config:  # heads have no positions; they read the final state
        hidden = getattr(target_config, "hidden_size", None)
        if hidden is not None and hidden != config["hidden_size"]:
            raise ExportError(
                f"the heads read target states of size {config['hidden_size']}, "
                f"the target's hidden size is {hidden}"
            )
        return
    theirs = getattr(target_config, "max_position_embeddings", None)
    if theirs is not None and theirs != config["max_position_embeddings"]:
        raise ExportError(
            f"the drafter's max_position_embeddings is {config['max_position_embeddings']} but "
            f"the target's is {theirs}; engines cap the context at the drafter's value, so "
            "rebuild the drafter for this target"
        )
    hidden = getattr(target_config, "hidden_size", None)
    if hidden is not None and hidden != config["target_hidden_size"]:
        raise ExportError(
            f"the drafter reads target states of size {config['target_hidden_size']}, "
            f"the target's hidden size is {hidden}"
        )


def verifier_reference(target: str) -> str:
    """How a loader elsewhere finds `target`: the absolute path of a local folder (from any
    working directory), else the hub id as given."""
    from .defaults import target_location

    location = target_location(target)
    folder = Path(location).expanduser()
    return str(folder.resolve()) if folder.is_dir() else location


def _eagle3(config, record, tensors, fmt: str, verifier: str, speculative_tokens: int):
    layers = list(record["hidden_state_layers"])
    num_layers = record["target"]["num_layers"]
    if fmt == "speculators" and len(set(layers)) != len(layers):
        raise ExportError(
            f"speculators loads only distinct hidden-state layer ids; this drafter reads "
            f"{layers} (export it to vllm or sglang)"
        )
    eagle = {
        "draft_vocab_size": config["draft_vocab_size"],
        "target_hidden_size": config["target_hidden_size"],
        "norm_before_residual": False,  # the residual is the fused state before hidden_norm
    }
    weights = dict(tensors)
    weights["d2t"] = weights["d2t"].to(torch.int64)
    weights["t2d"] = weights["t2d"].to(torch.bool)
    if fmt == "speculators":
        weights = {k.replace("midlayer.", "layers.0.", 1): v for k, v in weights.items()}
        out = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": _llama_fields(config),
            **eagle,
            # draftzoo's layer: no norm on the fused states (norm_before_fc, fc_norm), and the
            # pre-norm state carried from one step to the next (norm_output)
            "norm_before_fc": False,
            "fc_norm": False,
            "norm_output": False,
            "eagle_aux_hidden_state_layer_ids": vllm_layer_ids(layers, num_layers),
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [
                    {
                        "proposal_type": "greedy",
                        "speculative_tokens": speculative_tokens,
                        "verifier_accept_k": 1,
                        "accept_tolerance": 0.0,
                    }
                ],
                "default_proposal_method": "greedy",
                "verifier": {
                    "name_or_path": verifier,
                    "architectures": [record["target"]["architecture"]],
                },
            },
        }
        return out, weights
    out = {**_llama_fields(config), "architectures": ["LlamaForCausalLMEagle3"], **eagle}
    if fmt == "vllm":
        out["eagle_aux_hidden_state_layer_ids"] = vllm_layer_ids(layers, num_layers)
    else:
        out["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": sglang_layer_ids(layers, num_layers),
            "use_aux_hidden_state": True,
        }
    return out, weights


def _eagle1(config, tensors):
    if "fc.bias" in tensors:
        raise ExportError(
            "this EAGLE-1 drafter has a bias on fc; vLLM's EAGLE-1 layer has none and would "
            "drop it silently. Retrain with `eagle.fc_bias: false` (the default)."
        )
    weights = {k.replace("midlayer.", "layers.0.", 1): v for k, v in tensors.items()}
    out = {**_llama_fields(config), "architectures": ["EagleLlamaForCausalLM"]}
    return out, weights


def _medusa(config, tensors):
    """vLLM's `MedusaModel`: its parameter names are the heads' own; the config keys are
    exactly those vLLM's MedusaConfig reads."""
    out = {
        "architectures": ["MedusaModel"],
        "model_type": "medusa",
        "hidden_size": config["hidden_size"],
        "vocab_size": config["vocab_size"],
        "truncated_vocab_size": config["vocab_size"],
        "num_heads": config["medusa_num_heads"],
        "num_hidden_layers": config["medusa_num_layers"],
        "medusa_fc_bias": "blocks.0.layers.0.bias" in tensors,
    }
    return out, dict(tensors)


def _medusa_reference(config, tensors, base_model: str):
    """The Medusa reference layout: head h is `Sequential(ResBlock * L, Linear(h, V))`, so its
    block is `{h}.{l}.linear.*` and its projection `{h}.{L}.weight`; config keys as Medusa's
    `MedusaConfig` (and TGI) read them."""
    layers = config["medusa_num_layers"]
    if layers != 1:
        raise ExportError(
            f"the Medusa reference layout repeats one residual block per head, so it holds "
            f"heads of 1 layer; these have {layers} (export them to vllm)"
        )
    weights = {}
    for head in range(config["medusa_num_heads"]):
        for part in ("weight", "bias"):
            key = f"blocks.{head}.layers.0.{part}"
            if key in tensors:
                weights[f"{head}.0.linear.{part}"] = tensors[key]
        weights[f"{head}.1.weight"] = tensors[f"lm_heads.{head}.weight"]
    out = {
        "medusa_num_heads": config["medusa_num_heads"],
        "medusa_num_layers": layers,
        "base_model_name_or_path": base_model,
        "hidden_size": config["hidden_size"],
        "vocab_size": config["vocab_size"],
    }
    return out, weights


def _merged_target(folder: Path, base_model: str, output: Path) -> None:
    """Medusa-2: the base target with the drafter's adapter merged, saved to `output`."""
    from transformers import AutoTokenizer

    from .defaults import target_location
    from .lora_adapter import adapter_dir, merge_adapter
    from .safe_load import load_causal_lm

    location = target_location(base_model)
    base = load_causal_lm(location, dtype="auto")
    merged = merge_adapter(base, adapter_dir(folder))
    merged.save_pretrained(output)
    AutoTokenizer.from_pretrained(location).save_pretrained(output)


def _recorded(record: dict[str, Any]) -> str:
    """The target path the drafter's recipe names."""
    return str(record.get("recipe", {}).get("target", {}).get("path", ""))


@dataclass(frozen=True)
class ExportJob:
    """What one export writes besides the drafter's own tensors."""

    target: str  # where the target is: the recipe's, or the one the user names
    verifier: str  # the target as formats that name it record it
    speculative_tokens: int
    embed_tokens: bool  # write the target's input embedding (EAGLE-3)


def export_drafter(
    path: Path,
    output_dir: Path,
    fmt: str,
    target_config=None,
    verifier: str | None = None,
    speculative_tokens: int = 3,
    target: str | None = None,
    embed_tokens: bool | None = None,
) -> Path:
    """Write drafter `path` in format `fmt` to `output_dir` (atomically); returns it.

    `target_config`: the target's transformers config, to check positions and hidden size
    against (skipped when None). `target`: where the target is (default: the recipe's).
    `verifier`: what formats that name the target record (default: `verifier_reference`).
    `embed_tokens`: write the target's input embedding into an EAGLE-3 export (default:
    where the peer's own exporter does, `EMBEDDING_BY_DEFAULT`).
    """

    path, output_dir = Path(path), output_path(output_dir)
    check_replaceable(output_dir)  # before any work
    record = read_drafter_record(path)
    family = record["family"]
    if fmt not in FORMATS.get(family, ()):
        known = ", ".join(FORMATS.get(family, ())) or "none"
        raise ExportError(f"a {family} drafter exports to: {known} (asked for {fmt!r})")
    if embed_tokens and family != "eagle3":
        raise ExportError(f"only EAGLE-3 exports carry the target's embedding, not {family}")
    target = target or _recorded(record)
    job = ExportJob(
        target=target,
        verifier=verifier or (verifier_reference(target) if target else ""),
        speculative_tokens=speculative_tokens,
        embed_tokens=family == "eagle3"
        and (fmt in EMBEDDING_BY_DEFAULT if embed_tokens is None else embed_tokens),
    )
    tmp = output_dir.with_name(output_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _fill(path, tmp, record, fmt, target_config, job)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a refused or failed export leaves nothing
        raise
    return replace_dir(tmp, output_dir)


def _fill(path, tmp, record, fmt, target_config, job: ExportJob) -> None:
    """Write the export of drafter `path` into the empty folder `tmp`."""
    from safetensors.torch import save_file

    from .defaults import target_location

    family = record["family"]
    if not job.target and (family in ("mtp", "medusa2") or job.embed_tokens):
        raise ExportError(f"{path}: the drafter's record names no target; name it (--target)")
    config = json.loads((path / "config.json").read_text())
    for name in TOKENIZER_FILES:
        if (path / name).is_file():
            shutil.copy2(path / name, tmp / name)
    if family == "mtp":
        from .mtp_export import export_mtp

        export_mtp(path, tmp, Path(target_location(job.target)), read_drafter_weights(path))
        return
    if family == "draft_lm":
        (tmp / "config.json").write_text(json.dumps({**config, "draftzoo": {"family": family}}))
        shutil.copy2(path / "model.safetensors", tmp / "model.safetensors")
        return

    _check_positions(config, target_config)
    tensors = read_drafter_weights(path)
    if family == "eagle3":
        out, weights = _eagle3(config, record, tensors, fmt, job.verifier, job.speculative_tokens)
    elif family in ("medusa1", "medusa2") and fmt == "medusa":
        out, weights = _medusa_reference(config, tensors, job.verifier)
    elif family in ("medusa1", "medusa2"):
        out, weights = _medusa(config, tensors)
    else:
        out, weights = _eagle1(config, tensors)
    out["torch_dtype"] = _dtype_name(tensors)
    out["draftzoo"] = {"family": family, "hidden_state_layers_hf": record["hidden_state_layers"]}
    if job.embed_tokens:
        weights["embed_tokens.weight"] = _target_embedding(target_location(job.target), config)
        out["draftzoo"]["embed_tokens_from"] = verifier_reference(job.target)
    (tmp / "config.json").write_text(json.dumps(out, indent=1))
    weights = {k: v.contiguous() for k, v in weights.items()}
    weights_file = MEDUSA_HEADS_FILE if fmt == "medusa" else "model.safetensors"
    save_file(weights, str(tmp / weights_file), metadata={"format": "pt"})
    if family == "medusa2":
        _merged_target(path, job.target, tmp / "target")


def _target_embedding(location: str, config: dict[str, Any]) -> torch.Tensor:
    """The target's input embedding, checked against the drafter's vocabulary and width."""
    from .checkpoint_files import input_embedding

    embedding = input_embedding(location)
    expected = (config["vocab_size"], config["hidden_size"])
    if tuple(embedding.shape) != expected:
        raise ExportError(
            f"{location}: the target's input embedding is {tuple(embedding.shape)}, the drafter "
            f"reads tokens of a [{expected[0]}, {expected[1]}] one"
        )
    return embedding


def describe_export(folder: Path) -> list[str]:
    """What an export holds that a user must know: the target it names, the embedding."""
    config = json.loads((Path(folder) / "config.json").read_text())
    lines = []
    verifier = config.get("speculators_config", {}).get("verifier", {}).get("name_or_path")
    if verifier:
        lines.append(f"verifier: {verifier}")
    if config.get("base_model_name_or_path"):
        lines.append(f"base model: {config['base_model_name_or_path']}")
    source = config.get("draftzoo", {}).get("embed_tokens_from")
    if source:
        lines.append(f"embed_tokens: the target's input embedding, from {source}")
    elif config.get("draftzoo", {}).get("family") == "eagle3":
        lines.append("embed_tokens: not written (the loader takes the target's)")
    return lines
