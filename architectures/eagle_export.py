"""EAGLE-1 and EAGLE-3 exporters (the families' `exporters`; architectures/export.py says
what each layout holds and how layer ids are counted)."""

from __future__ import annotations

import torch

from .errors import ExportError
from .export import Export, llama_fields, sglang_layer_ids, vllm_layer_ids


def export_eagle3(export: Export) -> None:
    """EAGLE-3 -> `LlamaForCausalLMEagle3` (vllm, sglang) or `Eagle3Speculator` (speculators)."""
    export.check_positions()
    out, weights = _eagle3_layout(
        export.config,
        export.record,
        export.tensors(),
        export.fmt,
        export.verifier,
        export.speculative_tokens,
    )
    export.write_checkpoint(out, weights)


def _eagle3_layout(config, record, tensors, fmt: str, verifier: str, speculative_tokens: int):
    """(config, weights) of an EAGLE-3 drafter in `fmt`."""
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
            "transformer_layer_config": llama_fields(config),
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
    out = {**llama_fields(config), "architectures": ["LlamaForCausalLMEagle3"], **eagle}
    if fmt == "vllm":
        out["eagle_aux_hidden_state_layer_ids"] = vllm_layer_ids(layers, num_layers)
    else:
        out["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": sglang_layer_ids(layers, num_layers),
            "use_aux_hidden_state": True,
        }
    return out, weights


def export_eagle1(export: Export) -> None:
    """EAGLE-1 -> vLLM's `EagleLlamaForCausalLM` (fc, layers.0.*, no input norm)."""
    export.check_positions()
    tensors = export.whole_vocabulary_tensors()
    if "fc.bias" in tensors:
        raise ExportError(
            "this EAGLE-1 drafter has a bias on fc; vLLM's EAGLE-1 layer has none and would "
            "drop it silently. Retrain with `eagle.fc_bias: false` (the default)."
        )
    weights = {k.replace("midlayer.", "layers.0.", 1): v for k, v in tensors.items()}
    out = {**llama_fields(export.config), "architectures": ["EagleLlamaForCausalLM"]}
    export.write_checkpoint(out, weights)


def export_eagle3_gguf(export: Export) -> None:
    """EAGLE-3 -> `LlamaForCausalLMEagle3` -> llama.cpp's `eagle3` GGUF (gguf_export.py)."""
    from .gguf_export import convert_with_llama_cpp

    convert_with_llama_cpp(export, "vllm", export_eagle3, True, "draft-eagle3")
