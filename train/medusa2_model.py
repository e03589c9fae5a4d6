"""What Medusa-2 trains: the target with a peft LoRA, and the heads on its final state.

One module, so one forward (what DDP and DeepSpeed see) runs the adapted target and every
head. Its state dict holds only the trained tensors (LoRA matrices and heads): checkpoints stay
the adapter's size, not the target's, and loading one back leaves the frozen base as it is.
`original()` is peft's `disable_adapter`: inside it the same module is the unadapted target.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from ..architectures.lora_adapter import ADAPTER_DIR
from ..architectures.medusa import MedusaHeads

#: a trained tensor's name in this module -> its name in the PeftModel's state dict
_PEFT_NAME = re.compile(r"^target\.model\.")


class AdaptedTargetHeads(nn.Module):
    """The LoRA-adapted target (`TargetAdapter` whose model peft adapted) and its heads."""

    def __init__(self, target, peft_model, heads: MedusaHeads) -> None:
        super().__init__()
        self.target = target
        self.heads = heads
        self._peft = (peft_model,)  # a tuple: not registered twice as a submodule
        # each trained tensor once, under its first name (the target's layers are reachable
        # under two: the model's own path and the adapter's `decoder_layers` alias)
        self._trained = {n for n, p in self.named_parameters() if p.requires_grad}
        # and the heads' buffers (a truncated draft vocabulary's `token_map`): the drafter needs
        # them, though they are set when the heads are built, not trained
        self._kept = self._trained | {f"heads.{n}" for n, _ in heads.named_buffers()}
        self.register_state_dict_post_hook(_kept_only)
        self.register_load_state_dict_post_hook(_ignore_untrained)

    @property
    def peft_model(self):
        return self._peft[0]

    def original(self):
        """Context in which the target runs without its adapter."""
        return self.peft_model.disable_adapter()

    def forward(self, model_inputs: dict, head_inputs: list[torch.Tensor]):
        """(the adapted target's final post-norm states [b, s, h], each head's states on its
        own positions before its projection); the loss runs the vocabulary projections a
        chunk of rows at a time. `head_inputs[k]`: [b, s] bool, the positions head k reads."""
        final = self.final_states(model_inputs)
        return final, self.heads([final[keep] for keep in head_inputs])

    def final_states(self, model_inputs: dict) -> torch.Tensor:
        """The target's final post-norm states [b, s, h] (adapted, unless in `original()`)."""
        layer = self.target.num_layers
        out = self.target(**model_inputs, hidden_indices=[layer], compute_logits=False)
        return out.hidden_states[layer]

    def save_pretrained(
        self, path, safe_serialization: bool = True, state_dict: dict | None = None
    ) -> None:
        """The heads (config.json, model.safetensors) and, in `adapter/`, the LoRA in peft's
        format; `state_dict`: this module's (gathered) trained tensors."""
        state_dict = state_dict if state_dict is not None else self.state_dict()
        heads = {k.removeprefix("heads."): v for k, v in state_dict.items() if k[:6] == "heads."}
        self.heads.save_pretrained(path, state_dict=heads)
        adapter = {_PEFT_NAME.sub("base_model.model.", k): v for k, v in state_dict.items()}
        adapter = {k: v for k, v in adapter.items() if k.startswith("base_model.model.")}
        self.peft_model.save_pretrained(str(path / ADAPTER_DIR), state_dict=adapter)
        (path / ADAPTER_DIR / "README.md").unlink(missing_ok=True)  # peft's blank card


def _kept_only(module: AdaptedTargetHeads, state_dict, prefix, local_metadata) -> None:
    """State-dict hook: only the trained tensors and the heads' buffers are kept."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        if key[len(prefix) :] not in module._kept:
            del state_dict[key]


def _ignore_untrained(module: AdaptedTargetHeads, incompatible) -> None:
    """Load hook: the frozen base is not in a checkpoint, so it is not 'missing' (nor are the
    heads' buffers, set when the heads were built)."""
    missing = [k for k in incompatible.missing_keys if _unprefixed(k) in module._trained]
    incompatible.missing_keys[:] = missing


def _unprefixed(key: str) -> str:
    """A key without a wrapper's prefix (DDP's `module.`)."""
    return key.removeprefix("module.")
