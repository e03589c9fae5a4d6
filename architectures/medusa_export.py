"""Medusa-1/2 exporters (the families' `exporters`): vLLM's `MedusaModel` and the Medusa
reference code's `medusa_lm_head.safetensors` (TGI and TensorRT-LLM read it too). A family
that adapts the target (Medusa-2) also writes the base with its LoRA merged to
`<output>/target/`: serve the heads with *that* target."""

from __future__ import annotations

from pathlib import Path

from .errors import ExportError
from .export import Export
from .families import family_spec

#: the Medusa reference code's weights file
MEDUSA_HEADS_FILE = "medusa_lm_head.safetensors"


def export_vllm(export: Export) -> None:
    """Medusa heads -> vLLM's `MedusaModel`."""
    export.check_positions()
    out, weights = _vllm_layout(export.config, export.tensors())
    export.write_checkpoint(out, weights)
    _write_adapted_target(export)


def export_reference(export: Export) -> None:
    """Medusa heads -> the Medusa reference layout."""
    export.check_positions()
    out, weights = _reference_layout(export.config, export.tensors(), export.verifier)
    export.write_checkpoint(out, weights, MEDUSA_HEADS_FILE)
    _write_adapted_target(export)


def _write_adapted_target(export: Export) -> None:
    if family_spec(export.record["family"]).adapts_target:
        _merged_target(export.source, export.target, export.folder / "target")


def _vllm_layout(config, tensors):
    """vLLM's `MedusaModel`: its parameter names are the heads' own (truncated heads keep
    their `token_map`, which vLLM reads by that name); the config keys are exactly those vLLM's
    MedusaConfig reads."""
    out = {
        "architectures": ["MedusaModel"],
        "model_type": "medusa",
        "hidden_size": config["hidden_size"],
        "vocab_size": config["vocab_size"],
        "truncated_vocab_size": config.get("truncated_vocab_size", config["vocab_size"]),
        "num_heads": config["medusa_num_heads"],
        "num_hidden_layers": config["medusa_num_layers"],
        "medusa_fc_bias": "blocks.0.layers.0.bias" in tensors,
    }
    return out, dict(tensors)


def _reference_layout(config, tensors, base_model: str):
    """The Medusa reference layout: head h is `Sequential(ResBlock * L, Linear(h, V))`, so its
    block is `{h}.{l}.linear.*` and its projection `{h}.{L}.weight`; config keys as Medusa's
    `MedusaConfig` (and TGI) read them."""
    layers = config["medusa_num_layers"]
    if "truncated_vocab_size" in config:
        raise ExportError(
            f"these heads cover {config['truncated_vocab_size']} of {config['vocab_size']} "
            "tokens; the Medusa reference layout has no token map (export them to vllm, or "
            "train with medusa.draft_vocab_size: null)"
        )
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

    from .defaults import target_location
    from .lora_adapter import adapter_dir, merge_adapter
    from .safe_load import load_causal_lm, load_tokenizer

    location = target_location(base_model)
    base = load_causal_lm(location, dtype="auto")
    merged = merge_adapter(base, adapter_dir(folder))
    merged.save_pretrained(output)
    load_tokenizer(location).save_pretrained(output)
