"""MTP modules that a target's own checkpoint ships, in the layouts the engines load.

- `deepseek_v3` (vLLM `deepseek_mtp.py`, SGLang `deepseek_nextn.py`; GLM-4.5 too): module k at
  `model.layers.{N+k}.` — `enorm`, `hnorm`, `eh_proj`, `shared_head.norm`, `shared_head.head`,
  `embed_tokens`, and the decoder layer's own keys under the same prefix (vLLM adds
  `mtp_block.` to those when loading).
- `qwen3_next` (vLLM `qwen3_next_mtp.py`): one module under `mtp.` — `fc`,
  `pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `norm`, and the block at `mtp.layers.0.`.
- `mimo` (vLLM `mimo_mtp.py`): module k at `model.mtp_layers.{k}.` — `token_layernorm`,
  `hidden_layernorm`, `input_proj`, `final_layernorm`, and the block's keys under the prefix.

Mapped onto draftzoo's names (transformers' `MtpLayer`): enorm, hnorm, eh_proj, post_norm,
mtp_block.*. MiMo's projection reads cat(hidden, embedding): its input columns are swapped
into draftzoo's embedding-first order on the way in and back on the way out. The shared
embedding and head copies some layouts carry are checked equal to the target's (draftzoo
shares the target's) and not stored. Per-expert MoE weights (`mlp.experts.{e}.gate_proj`, ...)
are fused into transformers' `experts.gate_up_proj` / `experts.down_proj` and split back.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from .checkpoint_files import checkpoint_files, local_folder
from .errors import DraftzooError

LAYOUTS = ("deepseek_v3", "qwen3_next", "mimo")
#: the layout's own names for the module's non-block tensors -> draftzoo's
OWN_NAMES = {
    "deepseek_v3": {
        "enorm": "enorm",
        "hnorm": "hnorm",
        "eh_proj": "eh_proj",
        "shared_head.norm": "post_norm",
    },
    "mimo": {
        "token_layernorm": "enorm",
        "hidden_layernorm": "hnorm",
        "input_proj": "eh_proj",
        "final_layernorm": "post_norm",
    },
    "qwen3_next": {
        "pre_fc_norm_embedding": "enorm",
        "pre_fc_norm_hidden": "hnorm",
        "fc": "eh_proj",
        "norm": "post_norm",
    },
}
#: copies of the target's embedding / head some layouts carry inside each module
SHARED_NAMES = {"embed_tokens": "embed", "shared_head.head": "head"}
EXPERT = re.compile(r"^(?P<pre>.*mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")


class NativeMtpError(DraftzooError, ValueError):
    """A checkpoint whose native MTP modules cannot serve the asked-for drafter."""


def native_prefixes(keys, layout: str, num_layers: int) -> list[str]:
    """The key prefix of each native module, in depth order."""
    if layout == "qwen3_next":
        return ["mtp."] if any(k.startswith("mtp.") for k in keys) else []
    pattern = (
        re.compile(r"^model\.layers\.(\d+)\.")
        if layout == "deepseek_v3"
        else re.compile(r"^model\.mtp_layers\.(\d+)\.")
    )
    found = {int(m.group(1)) for m in map(pattern.match, keys) if m}
    if layout == "deepseek_v3":
        found = {i for i in found if i >= num_layers}
        first = num_layers
    else:
        first = 0
    depth = 0
    while first + depth in found:
        depth += 1
    template = "model.layers.{}." if layout == "deepseek_v3" else "model.mtp_layers.{}."
    return [template.format(first + k) for k in range(depth)]


def detect_layout(keys, num_layers: int) -> tuple[str, list[str]]:
    """(layout, module prefixes) of the native MTP modules among checkpoint `keys`."""
    keys = list(keys)
    for layout in LAYOUTS:
        prefixes = native_prefixes(keys, layout, num_layers)
        if prefixes:
            return layout, prefixes
    raise NativeMtpError(
        "the target's checkpoint ships no MTP modules (looked for DeepSeek-V3 "
        f"`model.layers.{num_layers}.eh_proj`, Qwen3-Next `mtp.fc`, MiMo "
        "`model.mtp_layers.0.input_proj`); use mtp.init_from: scratch"
    )


def module_key(layout: str, k: int, rest: str) -> str | None:
    """draftzoo's key for a native key's `rest` (after the module prefix) in module k; None
    for the shared embedding / head copies."""
    if layout == "qwen3_next":
        if rest.startswith("layers.0."):
            return f"layers.{k}.mtp_block.{rest.removeprefix('layers.0.')}"
        if rest.startswith("layers."):
            raise NativeMtpError(
                f"mtp.{rest}: the Qwen3-Next layout holds one MTP module (one fc and norm); "
                "a second block has no projection of its own"
            )
    for native, own in OWN_NAMES[layout].items():
        if rest.startswith(native + "."):
            return f"layers.{k}.{own}.{rest.removeprefix(native + '.')}"
    if any(rest.startswith(name + ".") for name in SHARED_NAMES):
        return None
    return f"layers.{k}.mtp_block.{rest}"


def swap_halves(weight: torch.Tensor) -> torch.Tensor:
    """[h, 2h] with its two input halves exchanged (MiMo's cat(hidden, embedding))."""
    first, second = weight.chunk(2, dim=1)
    return torch.cat([second, first], dim=1)


def fuse_experts(tensors: dict[str, torch.Tensor], expected: set[str]) -> dict[str, torch.Tensor]:
    """Per-expert MoE weights -> transformers' fused `gate_up_proj` [E, 2I, H] (gate rows
    first) and `down_proj` [E, H, I], where `expected` (the module's keys) has them fused."""
    groups: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    out = {}
    for key, tensor in tensors.items():
        match = EXPERT.match(key)
        if match is None or key in expected:
            out[key] = tensor
            continue
        group = groups.setdefault(match["pre"], {})
        group.setdefault(match["proj"], {})[int(match["e"])] = tensor
    for pre, projections in groups.items():
        experts = sorted(projections["gate"])
        out[f"{pre}.gate_up_proj"] = torch.stack(
            [torch.cat([projections["gate"][e], projections["up"][e]]) for e in experts]
        )
        out[f"{pre}.down_proj"] = torch.stack([projections["down"][e] for e in experts])
    return out


def split_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of `fuse_experts`: fused expert tensors back to per-expert weights."""
    out = {}
    for key, tensor in tensors.items():
        if key.endswith("mlp.experts.gate_up_proj"):
            pre = key.removesuffix(".gate_up_proj")
            for e, rows in enumerate(tensor):
                gate, up = rows.chunk(2, dim=0)
                out[f"{pre}.{e}.gate_proj.weight"] = gate
                out[f"{pre}.{e}.up_proj.weight"] = up
        elif key.endswith("mlp.experts.down_proj"):
            pre = key.removesuffix(".down_proj")
            for e, weight in enumerate(tensor):
                out[f"{pre}.{e}.down_proj.weight"] = weight
        else:
            out[key] = tensor
    return out


def read_native(folder: Path, num_layers: int) -> tuple[str, dict[int, dict[str, torch.Tensor]]]:
    """(layout, {module k: {key after the module prefix: tensor}}) of a checkpoint's MTP."""
    from safetensors import safe_open

    files = checkpoint_files(folder)
    layout, prefixes = detect_layout(files, num_layers)
    modules: dict[int, dict[str, torch.Tensor]] = {k: {} for k in range(len(prefixes))}
    handles = {}
    for key, file in files.items():
        for k, prefix in enumerate(prefixes):
            if key.startswith(prefix):
                if file not in handles:
                    handles[file] = safe_open(str(file), framework="pt")
                modules[k][key.removeprefix(prefix)] = handles[file].get_tensor(key)
    return layout, modules


def load_native_modules(drafter, folder: Path | str, target) -> str:
    """Copy the checkpoint's native MTP modules into `drafter` (an `MtpDrafter` for
    `target`, a `TargetAdapter`), checked tensor by tensor; returns the layout's name."""
    folder = local_folder(folder)
    layout, modules = read_native(folder, target.num_layers)
    if drafter.depth > len(modules):
        raise NativeMtpError(
            f"mtp.depth is {drafter.depth} but the target's checkpoint ships "
            f"{len(modules)} MTP module(s) ({layout} layout)"
        )
    own = drafter.state_dict()
    loaded: dict[str, torch.Tensor] = {}
    for k in range(drafter.depth):
        tensors = {}
        for rest, tensor in modules[k].items():
            key = module_key(layout, k, rest)
            if key is None:
                _check_shared(rest, tensor, target)
            else:
                tensors[key] = swap_halves(tensor) if _is_mimo_projection(layout, key) else tensor
        loaded.update(fuse_experts(tensors, set(own)))
    for key, tensor in loaded.items():
        if key not in own:
            raise NativeMtpError(f"{folder}: native tensor for {key} has no place in the module")
        if tensor.shape != own[key].shape:
            raise NativeMtpError(
                f"{folder}: native {key} has shape {tuple(tensor.shape)}, the module built from "
                f"the target's config needs {tuple(own[key].shape)} (hidden-size mismatch?)"
            )
    missing = sorted(set(own) - set(loaded))
    if missing:
        raise NativeMtpError(f"{folder}: the native MTP modules lack {missing[:6]}")
    drafter.load_state_dict({k: v.to(own[k].dtype) for k, v in loaded.items()})
    return layout


def _is_mimo_projection(layout: str, key: str) -> bool:
    return layout == "mimo" and key.endswith(".eh_proj.weight")


def _check_shared(rest: str, tensor: torch.Tensor, target) -> None:
    """A module's copy of the embedding or head must be the target's (draftzoo shares it)."""
    name = next(n for n in SHARED_NAMES if rest.startswith(n + "."))
    module = target.embed_tokens if SHARED_NAMES[name] == "embed" else target.lm_head
    mine = module.weight.detach().cpu()
    if tensor.shape != mine.shape or not torch.equal(tensor.to(mine.dtype), mine):
        raise NativeMtpError(
            f"the native MTP module's {rest} differs from the target's {SHARED_NAMES[name]}; "
            "draftzoo's MTP modules share the target's embedding and head"
        )


def to_deepseek_layout(
    tensors: dict[str, torch.Tensor], num_layers: int, embed: torch.Tensor, head: torch.Tensor
) -> dict[str, torch.Tensor]:
    """draftzoo's module tensors in the DeepSeek-V3 layout vLLM's `deepseek_mtp` loads: module
    k at `model.layers.{N+k}.`, with the embedding and head copies it reads per module."""
    inverse = {own: native for native, own in OWN_NAMES["deepseek_v3"].items()}
    out: dict[str, torch.Tensor] = {}
    depth = 1 + max(int(key.split(".")[1]) for key in tensors)
    for key, tensor in split_experts(tensors).items():
        _, k, part, *rest = key.split(".")
        prefix = f"model.layers.{num_layers + int(k)}."
        if part == "mtp_block":
            out[prefix + ".".join(rest)] = tensor
        else:
            out[prefix + ".".join([inverse[part], *rest])] = tensor
    for k in range(depth):
        prefix = f"model.layers.{num_layers + k}."
        out[prefix + "embed_tokens.weight"] = embed
        out[prefix + "shared_head.head.weight"] = head
    return out
