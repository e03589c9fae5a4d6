"""The target's LoRA adapter (Medusa-2), in peft's own format.

Training attaches a peft LoRA to the target (`attach_lora`); the published drafter keeps it in
`<drafter>/adapter/` exactly as `PeftModel.save_pretrained` writes it (`adapter_config.json`,
`adapter_model.safetensors`), so peft loads it as any other adapter. Serving merges it into
the base target (`merge_adapter`), after checking every LoRA matrix fits the module it adapts:
an adapter trained for another base is refused naming the module, before peft sees it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from .errors import DraftzooError

ADAPTER_DIR = "adapter"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
#: every linear layer but the output head: on Llama the seven projections the Medusa paper
#: adapts, on any other architecture its own (Phi-3's fused `qkv_proj`, DeepSeek-V3's MLA
#: projections; MoE experts kept as stacked tensors are not layers, so not adapted)
ALL_LINEAR = "all-linear"
DEFAULT_MODULES = (ALL_LINEAR,)


class AdapterError(DraftzooError, ValueError):
    """An adapter that is missing, unreadable, or made for another base model."""


@dataclass(frozen=True)
class LoraSpec:
    """The LoRA put on the target (defaults as the Medusa paper's Medusa-2 runs)."""

    rank: int = 32  # r
    alpha: int = 16  # lora_alpha: the update is scaled by alpha / rank
    dropout: float = 0.05  # lora_dropout
    target_modules: tuple[str, ...] = DEFAULT_MODULES  # module names peft adapts

    def __post_init__(self) -> None:
        if self.rank < 1 or self.alpha <= 0:
            raise ValueError("lora.rank must be >= 1 and lora.alpha > 0")
        if not 0 <= self.dropout < 1:
            raise ValueError("lora.dropout must be in [0, 1)")
        if not self.target_modules:
            raise ValueError("lora.target_modules must name at least one module")
        if ALL_LINEAR in self.target_modules and len(self.target_modules) > 1:
            raise ValueError(f"lora.target_modules: {ALL_LINEAR!r} stands alone")

    def peft_config(self, modules: list[str]):
        """This spec as peft's `LoraConfig` adapting `modules` (`resolved_modules`)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=modules,
            target_parameters=[],  # layers only: never peft's defaults for stacked experts
            bias="none",
            task_type="CAUSAL_LM",
        )


def linear_layers(model: nn.Module) -> dict[str, str]:
    """{full name: last name part} of `model`'s linear layers, its output head excluded."""
    head = model.get_output_embeddings()
    return {
        name: name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and module is not head
    }


def resolved_modules(model: nn.Module, spec: LoraSpec) -> list[str]:
    """The full names of the linear layers `spec` adapts in `model`: those whose last name
    part it lists, or all of them (`ALL_LINEAR`). Full names, so a name that is also a
    stacked expert tensor's (DeepSeek-V3's `down_proj`) adapts only the layers. A name no
    linear layer has is refused."""
    layers = linear_layers(model)
    if ALL_LINEAR in spec.target_modules:
        return sorted(layers)
    missing = sorted(set(spec.target_modules) - set(layers.values()))
    if missing:
        raise AdapterError(
            f"lora.target_modules {missing} are not linear layers of {type(model).__name__} "
            f"(it has {sorted(set(layers.values()))}; {ALL_LINEAR!r} adapts them all)"
        )
    return sorted(name for name, last in layers.items() if last in spec.target_modules)


def attach_lora(model: nn.Module, spec: LoraSpec):
    """Wrap a transformers causal LM in a trainable peft LoRA (injected into `model` in
    place); refuses target modules the model does not have."""
    from peft import get_peft_model

    modules = resolved_modules(model, spec)
    try:
        adapted = get_peft_model(model, spec.peft_config(modules))
    except ValueError as err:  # peft's word on a model it cannot adapt so (e.g. MoE experts)
        raise AdapterError(
            f"peft cannot put this LoRA on {type(model).__name__}: {err} (on MoE models peft "
            "adapts layers named as the experts' were as the stacked experts, which takes "
            "lora.dropout: 0; or list lora.target_modules without them)"
        ) from err
    # peft shortens a long module list to the suffixes that tell the modules apart and saves
    # those; loading reads a suffix that is also a stacked-expert tensor's name (DeepSeek-V3's
    # `down_proj`) as that tensor: the saved config names the modules adapted in full
    adapted.peft_config["default"].target_modules = modules
    return adapted


def adapter_dir(folder: Path) -> Path:
    """Where a drafter folder keeps its adapter."""
    return Path(folder) / ADAPTER_DIR


def read_adapter(folder: Path, files=None) -> tuple[dict, dict]:
    """(adapter_config.json as a dict, the LoRA tensors) of the adapter in `folder`, from the
    bytes `files` (a drafter's `DrafterFiles`, the adapter under `ADAPTER_DIR`) read when
    given, else from its files."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    folder = Path(folder)
    if files is not None:
        contents = [files.data(f"{ADAPTER_DIR}/{name}") for name in ADAPTER_FILES]
    else:
        missing = [name for name in ADAPTER_FILES if not (folder / name).is_file()]
        if missing:
            raise AdapterError(f"{folder} is not a peft adapter: {', '.join(missing)} missing")
        contents = [(folder / name).read_bytes() for name in ADAPTER_FILES]
    try:
        config = json.loads(contents[0])
        tensors = load(contents[1])
    except (json.JSONDecodeError, UnicodeDecodeError, SafetensorError, ValueError) as err:
        raise AdapterError(f"the adapter in {folder} cannot be read: {err}") from err
    if not isinstance(config, dict):
        raise AdapterError(f"the adapter in {folder} cannot be read: its config is not an object")
    return config, tensors


def check_adapter(folder: Path, model: nn.Module, tensors: dict | None = None) -> None:
    """Refuse an adapter whose LoRA matrices do not fit `model` (another base); `tensors`: the
    adapter's, when read already."""
    if tensors is None:
        tensors = read_adapter(folder)[1]
    for key, tensor in tensors.items():
        if not key.endswith((".lora_A.weight", ".lora_B.weight")):
            continue
        path, kind = key.removeprefix("base_model.model.").rsplit(".lora_", 1)
        try:
            module = model.get_submodule(path)
        except AttributeError:
            raise AdapterError(
                f"the adapter in {folder} was trained for another base: it adapts {path}, "
                f"which {type(model).__name__} does not have"
            ) from None
        expected = module.in_features if kind.startswith("A") else module.out_features
        given = tensor.shape[1] if kind.startswith("A") else tensor.shape[0]
        if given != expected:
            side = "input" if kind.startswith("A") else "output"
            raise AdapterError(
                f"the adapter in {folder} was trained for another base: {path} has {side} "
                f"size {expected} here, the adapter's LoRA expects {given}"
            )


#: set on a model an adapter was merged into: the adapter's folder
MERGED_MARK = "draftzoo_merged_adapter"


def merge_adapter(model: nn.Module, folder: Path, files=None) -> nn.Module:
    """`model` with the adapter in `folder` merged into its weights, in place (checked first);
    the merged model serves at the base model's speed. Merging the same adapter again is a
    no-op; merging a second, different one is refused (the model is no longer the base).
    `files`: the drafter's files as the front door read them (the adapter is built from those
    bytes, as `PeftModel.from_pretrained` builds it from the folder: peft's config, model and
    state-dict loader)."""
    from peft import PeftConfig, PeftModel, set_peft_model_state_dict

    folder = Path(folder).resolve()
    merged_already = getattr(model, MERGED_MARK, None)
    if merged_already == str(folder):
        return model
    if merged_already is not None:
        raise AdapterError(
            f"this model already has the adapter in {merged_already} merged in; load a fresh "
            f"base model to serve the adapter in {folder}"
        )
    config, tensors = read_adapter(folder, files)
    check_adapter(folder, model, tensors)
    try:
        peft_config = PeftConfig.from_peft_type(**config)
    except (TypeError, ValueError, KeyError) as err:
        raise AdapterError(f"the adapter in {folder} has no peft config: {err}") from err
    peft_config.inference_mode = True
    adapted = PeftModel(model, peft_config)
    loaded = set_peft_model_state_dict(adapted, tensors)
    missing = [k for k in loaded.missing_keys if ".lora_" in k]
    if missing or loaded.unexpected_keys:
        raise AdapterError(
            f"the adapter in {folder} does not fit: missing {missing[:4]}, unexpected "
            f"{loaded.unexpected_keys[:4]}"
        )
    merged = adapted.merge_and_unload().eval()
    setattr(merged, MERGED_MARK, str(folder))
    return merged
