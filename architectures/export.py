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
| mtp    | `vllm`        | the target's (DeepSeek-style) | target + model.layers.{N+k}.* (1) |
| mtp    | `sglang`      | the target's (DeepSeek-style) | the same (2)                       |

(1) `mtp.hand_over: residual`; (2) `mtp.hand_over: normed`, one module (architectures/mtp.py).

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .drafter_files import DrafterFiles
from .drafter_io import (
    check_replaceable,
    is_marked_export,
    output_path,
    read_drafter_record,
    replace_dir,
    scratch_dir,
)
from .errors import DraftzooError, ExportError
from .gguf_settings import GgufSettings
from .target_head import MAP_KEYS

#: formats that carry the target's input embedding unless told otherwise
EMBEDDING_BY_DEFAULT = ("speculators",)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def llama_fields(config: dict[str, Any]) -> dict[str, Any]:
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


def _recorded(record: dict[str, Any]) -> str:
    """The target path the drafter's recipe names."""
    return str(record.get("recipe", {}).get("target", {}).get("path", ""))


@dataclass(frozen=True)
class Export:
    """One export in progress: the drafter, the empty folder it fills, and what it writes
    besides the drafter's own tensors. A family's exporter (its `FamilySpec.exporters`) is
    called with it."""

    source: Path  # the drafter folder
    folder: Path  # the empty folder the export fills (renamed into place when complete)
    record: dict[str, Any]  # the drafter's draftzoo.json
    config: dict[str, Any]  # the drafter's config.json
    fmt: str  # the format asked for
    target_config: Any  # the target's transformers config to check against, or None
    target: str  # where the target is: the recipe's, or the one the user names
    verifier: str  # the target as formats that name it record it
    speculative_tokens: int
    embed_tokens: bool  # write the target's input embedding
    files: DrafterFiles | None = None  # the drafter's files as the front door read them
    #: the `gguf` format's converter and float type
    gguf: GgufSettings = field(default_factory=GgufSettings)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The drafter's weights."""
        return (self.files or DrafterFiles.open(self.source)).weights()

    def whole_vocabulary_tensors(self) -> dict[str, torch.Tensor]:
        """The drafter's weights without a draft vocabulary's map (`target_head.py`): for
        formats whose engines draft over the target's whole head; `draft_vocabulary_note`
        says so in the export."""
        return {k: v for k, v in self.tensors().items() if k not in MAP_KEYS}

    def draft_vocabulary_note(self) -> str | None:
        """What an export without the map drafts, for a drafter that has one (None without)."""
        size, vocab = self.config.get("draft_vocab_size"), self.config.get("vocab_size")
        head = "the target's head"
        if self.record.get("draft_vocab_file"):  # a draft LM: its own head, the map beside it
            size, head = self.record.get("training", {}).get("draft_vocab_size"), "its own head"
        if size is None or vocab is None or size >= vocab:
            return None
        return (
            f"not carried: draftzoo drafts over {size} of {vocab} tokens ({head} "
            f"truncated); this format's engines draft over {head.removesuffix(' head')} whole head"
        )

    def target_location(self) -> str:
        """Where the target's files are (a local folder, or its hub cache)."""
        from .defaults import target_location

        return target_location(self.target)

    def check_positions(self) -> None:
        """Refuse a target whose positions or width the drafter does not match."""
        _check_positions(self.config, self.target_config)

    def write_checkpoint(
        self, out: dict[str, Any], weights: dict[str, torch.Tensor], file: str = "model.safetensors"
    ) -> None:
        """Write `out` as config.json (with its dtype and draftzoo's note) and `weights`."""
        from safetensors.torch import save_file

        out["torch_dtype"] = _dtype_name(weights)
        out["draftzoo"] = {
            "family": self.record["family"],
            "hidden_state_layers_hf": self.record["hidden_state_layers"],
        }
        if self.embed_tokens:
            weights["embed_tokens.weight"] = _target_embedding(self.target_location(), self.config)
            out["draftzoo"]["embed_tokens_from"] = verifier_reference(self.target)
        note = self.draft_vocabulary_note()
        if note and not set(MAP_KEYS) & set(weights):
            out["draftzoo"]["draft_vocabulary"] = note
        (self.folder / "config.json").write_text(json.dumps(out, indent=1))
        weights = {k: v.contiguous() for k, v in weights.items()}
        save_file(weights, str(self.folder / file), metadata={"format": "pt"})


#: the longest proposal an export may record (engines draft chains of a few tokens)
MAX_SPECULATIVE_TOKENS = 64


def _check_options(fmt: str, speculative_tokens, gguf: GgufSettings | None) -> None:
    """The proposal length an export records, and no converter settings for a format that
    runs no converter."""
    _check_speculative_tokens(speculative_tokens)
    if fmt != "gguf" and gguf not in (None, GgufSettings()):
        raise ExportError("--llama-cpp and --gguf-type are for --format gguf")


def _check_speculative_tokens(speculative_tokens) -> None:
    """The proposal length an export records: an integer in 1..MAX_SPECULATIVE_TOKENS."""
    if isinstance(speculative_tokens, bool) or not isinstance(speculative_tokens, int):
        raise ExportError(f"speculative_tokens must be an integer, got {speculative_tokens!r}")
    if not 1 <= speculative_tokens <= MAX_SPECULATIVE_TOKENS:
        raise ExportError(
            f"speculative_tokens must be in 1..{MAX_SPECULATIVE_TOKENS}, got {speculative_tokens}"
        )


def export_drafter(
    path: Path,
    output_dir: Path,
    fmt: str,
    target_config=None,
    verifier: str | None = None,
    speculative_tokens: int = 3,
    target: str | None = None,
    embed_tokens: bool | None = None,
    gguf: GgufSettings | None = None,
) -> Path:
    """Write drafter `path` in format `fmt` to `output_dir` (atomically); returns it.

    `target_config`: the target's transformers config, to check positions and hidden size
    against (skipped when None). `target`: where the target is (default: the recipe's).
    `verifier`: what formats that name the target record (default: `verifier_reference`).
    `embed_tokens`: write the target's input embedding into an export of a family that can
    carry it (default: where the peer's own exporter does, `EMBEDDING_BY_DEFAULT`).
    """
    from .families import family_spec

    _check_options(fmt, speculative_tokens, gguf)
    path, output_dir = Path(path), output_path(output_dir)
    check_replaceable(output_dir, inputs=(path,))  # before any work
    files = DrafterFiles.open(path)
    record = files.record
    spec = family_spec(record["family"])
    exporter = spec.exporter(fmt)
    target = target or _recorded(record)
    embed = _embedding_asked(spec, fmt, embed_tokens)
    if not target and (spec.export_needs_target or embed):
        raise ExportError(f"{path}: the drafter's record names no target; name it (--target)")
    config = files.json()
    verifier = verifier or (verifier_reference(target) if target else "")
    _check_no_linked_tokenizer_files(path)
    tmp = scratch_dir(output_dir, "tmp")  # from here on, a failure removes it
    export = Export(
        source=path,
        folder=tmp,
        record=record,
        config=config,
        fmt=fmt,
        target_config=target_config,
        target=target,
        verifier=verifier,
        speculative_tokens=speculative_tokens,
        embed_tokens=embed,
        files=files,
        gguf=gguf or GgufSettings(),
    )
    try:
        for name in TOKENIZER_FILES:
            if (path / name).is_file():  # no link (checked above)
                shutil.copy2(path / name, tmp / name)
        _run_exporter(exporter, export, spec.display_name)
        _check_marked(tmp, spec.name, fmt)
        return replace_dir(tmp, output_dir, inputs=(path,))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a refused or failed export leaves nothing
        raise


def _check_no_linked_tokenizer_files(path: Path) -> None:
    """Copied, a link would carry whatever it points to into the export."""
    linked = [name for name in TOKENIZER_FILES if (path / name).is_symlink()]
    if linked:
        raise ExportError(f"{path / linked[0]} is a symbolic link; export copies only files")


def _run_exporter(exporter, export: Export, family: str) -> None:
    """The family's exporter; whatever the drafter's files make it raise (they are untrusted
    input) is one line naming the folder."""
    try:
        exporter(export)
    except DraftzooError:
        raise
    except Exception as err:
        said = " ".join(str(err).split())[:300]
        raise ExportError(
            f"{export.source} does not export as a {family} drafter: {type(err).__name__}: {said}"
        ) from err


def export_for_target(
    drafter: str | Path,
    output_dir: Path,
    fmt: str,
    target: str | None = None,
    check_target: bool = True,
    **options: Any,
) -> Path:
    """`export_drafter` for a drafter folder or zoo name and a target by folder or hub name
    (default: the one its recipe names), whose config it is checked against unless
    `check_target` is False. `options`: `export_drafter`'s verifier, speculative_tokens,
    embed_tokens, gguf."""
    from .zoo_index import resolve_drafter

    folder, _ = resolve_drafter(drafter)
    target = target or _recorded(read_drafter_record(folder))
    target_config = None
    if check_target:
        if not target:
            raise ExportError(f"{folder}: the drafter's record names no target; name it (--target)")
        from .defaults import target_location
        from .safe_load import load_config

        target_config = load_config(target_location(target))
    return export_drafter(folder, output_dir, fmt, target_config, target=target, **options)


def _embedding_asked(spec, fmt: str, embed_tokens: bool | None) -> bool:
    """Whether the export carries the target's input embedding; asking it of a family whose
    exports cannot is refused."""
    if embed_tokens and not spec.export_embedding:
        carriers = ", ".join(s.display_name for s in _embedding_families())
        raise ExportError(
            f"only {carriers} exports carry the target's embedding, not {spec.display_name}"
        )
    if not spec.export_embedding:
        return False
    return fmt in EMBEDDING_BY_DEFAULT if embed_tokens is None else embed_tokens


def _check_marked(folder: Path, family: str, fmt: str) -> None:
    """Every export carries a `draftzoo` entry in its config.json, which is how a later export
    knows the folder is one it may replace (`check_replaceable`)."""
    if not is_marked_export(folder):
        raise ExportError(
            f"the {family} exporter for {fmt!r} wrote no config.json with a 'draftzoo' entry, "
            "so the folder could not be recognised as draftzoo's later"
        )


def _embedding_families():
    from .families import family_specs

    return [spec for spec in family_specs().values() if spec.export_embedding]


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
    vocabulary = config.get("draftzoo", {}).get("draft_vocabulary")
    if vocabulary:
        lines.append(f"draft vocabulary: {vocabulary}")
    gguf = config.get("draftzoo", {}).get("gguf")
    if gguf:
        lines.append(
            f"{gguf['file']} ({gguf['outtype']}, from {gguf['converted_from']} by "
            f"{gguf['converter']}): llama.cpp serves it with -md and --spec-type "
            f"{gguf['spec_type']}"
        )
        return lines
    source = config.get("draftzoo", {}).get("embed_tokens_from")
    if source:
        lines.append(f"embed_tokens: the target's input embedding, from {source}")
    elif _family_exports_embedding(config.get("draftzoo", {}).get("family")):
        lines.append("embed_tokens: not written (the loader takes the target's)")
    return lines


def _family_exports_embedding(family: str | None) -> bool:
    from .families import family_specs

    spec = family_specs().get(family or "")
    return spec is not None and spec.export_embedding
