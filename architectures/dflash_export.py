"""DFlash exporters (the family's `exporters`).

`vllm`, `sglang`: `DFlashDraftModel`, z-lab's layout, which both engines load as `dflash`:
Qwen3 config fields plus `block_size`, `num_target_layers` and
`dflash_config.{target_layer_ids, mask_token_id}`; weights `layers.*`, `fc`, `hidden_norm`,
`norm` (draftzoo's own names).

`speculators`: `DFlashSpeculator`: `transformer_layer_config` (Qwen3), `block_size`,
`aux_hidden_state_layer_ids`, `mask_token_id` and `speculators_config`; the same weights.

Layer ids: z-lab's `target_layer_ids` count outputs of layers (`hidden_states[id + 1]`), so they
are draftzoo's HF indices minus one; speculators' `aux_hidden_state_layer_ids` are the HF
indices themselves. The target's embedding and head are never written: every engine takes the
target's.
"""

from __future__ import annotations

from typing import Any

from .export import Export, llama_fields, sglang_layer_ids


def _qwen3_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The drafter's layers as a transformers Qwen3Config (Llama's fields, its layer count)."""
    fields = {**llama_fields(config), "model_type": "qwen3"}
    fields["num_hidden_layers"] = config["num_hidden_layers"]
    return fields


def export_engines(export: Export) -> None:
    """DFlash -> z-lab's `DFlashDraftModel` layout, which vLLM and SGLang load."""
    export.check_positions()
    config, record = export.config, export.record
    num_layers = record["target"]["num_layers"]
    out = {
        **_qwen3_fields(config),
        "architectures": ["DFlashDraftModel"],
        "block_size": config["block_size"],
        "num_target_layers": num_layers,
        "dflash_config": {
            "target_layer_ids": sglang_layer_ids(list(record["hidden_state_layers"]), num_layers),
            "mask_token_id": config["mask_token_id"],
        },
    }
    export.write_checkpoint(out, export.whole_vocabulary_tensors())


def export_speculators(export: Export) -> None:
    """DFlash -> speculators' `DFlashSpeculator` (full vocabulary: no d2t / t2d)."""
    export.check_positions()
    config, record = export.config, export.record
    layers = list(record["hidden_state_layers"])
    sglang_layer_ids(layers, record["target"]["num_layers"])  # inputs of real layers only
    out = {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "transformer_layer_config": _qwen3_fields(config),
        "draft_vocab_size": config["vocab_size"],
        "block_size": config["block_size"],
        "target_hidden_size": config["target_hidden_size"],
        "aux_hidden_state_layer_ids": layers,
        "mask_token_id": config["mask_token_id"],
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": config["block_size"] - 1,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": export.verifier,
                "architectures": [record["target"]["architecture"]],
            },
        },
    }
    export.write_checkpoint(out, export.whole_vocabulary_tensors())


def export_gguf(export: Export) -> None:
    """DFlash -> z-lab's `DFlashDraftModel` -> llama.cpp's `dflash` GGUF (gguf_export.py)."""
    from .gguf_export import convert_with_llama_cpp

    convert_with_llama_cpp(export, "vllm", export_engines, True, "draft-dflash")
