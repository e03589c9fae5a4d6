"""What both peer clients share: the inputs they read, the logits they capture, what they write.

Imported by the client scripts from their own folder (the script's folder is on `sys.path`);
it uses only torch and safetensors, which every peer venv has.
"""

import json

import torch
from safetensors.torch import load_file, save_file


def read_inputs(path: str) -> dict[str, torch.Tensor]:
    """`ids` [1, s] (the token after each position), `states` [1, s, 3h] as float32,
    `positions` [1, s]."""
    inputs = load_file(path)
    inputs["states"] = inputs["states"].float()
    return inputs


def capture_logits(lm_head: torch.nn.Module) -> list[torch.Tensor]:
    """A list that fills with the draft head's output at every training-time-test step."""
    logits: list[torch.Tensor] = []
    lm_head.register_forward_hook(lambda module, args, output: logits.append(output.float()))
    return logits


def write_result(out: str, logits, embedding: torch.Tensor, info: dict, **more) -> None:
    """OUT: the stacked logits [steps, 1, s, V], the embedding the loaded model holds, and any
    `more` tensors; then `info` as the one JSON line the test reads."""
    tensors = {"logits": torch.stack(logits), "embed_tokens": embedding.detach().float(), **more}
    save_file({k: v.contiguous() for k, v in tensors.items()}, out)
    print(json.dumps(info))
