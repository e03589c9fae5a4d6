"""The draft-LM family: a small causal LM on the target's tokenizer, distilled from its logits.

It is a stock transformers `LlamaForCausalLM` (so engines and `generate(assistant_model=...)`
load it as is), sized by `DraftLMConfig`, sharing the target's vocabulary, special tokens and
rope settings. It starts from its config, from an existing smaller checkpoint, or with the
target's embedding and output matrices copied in.

With `draft_vocab_size` it trains over the whole vocabulary and ships the map of the most
frequent supervised tokens beside its weights (`draft_vocab.safetensors`: speculators' `d2t`
and `t2d`); draftzoo's runtime then drafts through those rows of its head only. Its weights
stay the stock model's, so engines and exports draft over the whole vocabulary.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass

import torch

from .families import FamilySpec
from .target import TargetError

FAMILY_SPECS = (
    FamilySpec(
        name="draft_lm",
        display_name="draft LM",
        recipe="draftzoo.train.draft_lm:DraftLMRecipe",
        runtime="draftzoo.inference.proposers.draft_lm:load_runtime",
        exporters={
            "hf": "draftzoo.architectures.draft_lm:export_hf",
            "gguf": "draftzoo.architectures.draft_lm:export_gguf",
        },
        importers={"hf": "draftzoo.architectures.draft_lm:import_hf"},
        tests=("tests/train/test_draft_lm.py", "tests/inference/test_runtime.py"),
    ),
)


@dataclass(frozen=True)
class DraftLMConfig:
    """Shape and initialisation of the draft LM."""

    init_from: str | None = None  # an existing causal LM checkpoint (same vocabulary); or None
    hidden_size: int = 256  # ignored with init_from
    num_hidden_layers: int = 2
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    intermediate_size: int = 768
    tie_word_embeddings: bool = True
    copy_target_embeddings: bool = False  # start from the target's embeddings (same hidden size)
    #: draft over the N most frequent supervised tokens (a map shipped beside the weights;
    #: training and exports keep the whole head); None: the whole vocabulary
    draft_vocab_size: int | None = None

    def __post_init__(self) -> None:
        if self.init_from and self.copy_target_embeddings:
            raise ValueError("draft.copy_target_embeddings cannot be combined with init_from")
        sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
        for name in (*sizes, "intermediate_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"draft.{name} must be >= 1, got {getattr(self, name)}")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"draft.draft_vocab_size must be >= 1, got {self.draft_vocab_size}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("draft.hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("draft.num_attention_heads must be divisible by num_key_value_heads")


def draft_lm_model_config(config: DraftLMConfig, target_config):
    """The `LlamaConfig` of a fresh draft LM for `target_config`."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=target_config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=target_config.max_position_embeddings,
        rope_theta=getattr(target_config, "rope_theta", 10000.0),
        rope_scaling=getattr(target_config, "rope_scaling", None),
        rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-6),
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=target_config.bos_token_id,
        eos_token_id=target_config.eos_token_id,
        pad_token_id=getattr(target_config, "pad_token_id", None),
    )


def build_draft_lm(config: DraftLMConfig, target_model) -> torch.nn.Module:
    """A draft LM for `target_model`; refuses a starting checkpoint with another vocabulary."""
    from transformers import LlamaForCausalLM

    from .safe_load import load_causal_lm

    target_vocab = target_model.get_output_embeddings().weight.shape[0]
    if config.init_from:
        model = load_causal_lm(config.init_from, dtype=torch.float32)
        vocab = model.get_output_embeddings().weight.shape[0]
        if vocab != target_vocab:
            raise TargetError(
                f"draft init_from {config.init_from} has vocabulary {vocab}, "
                f"the target has {target_vocab}"
            )
        return model
    model = LlamaForCausalLM(draft_lm_model_config(config, target_model.config))
    if config.copy_target_embeddings:
        source = target_model.get_input_embeddings().weight
        if source.shape[1] != config.hidden_size:
            raise TargetError(
                f"copy_target_embeddings needs draft hidden_size == target's ({source.shape[1]}), "
                f"got {config.hidden_size}"
            )
        with torch.no_grad():
            model.get_input_embeddings().weight.copy_(source.float())
            if not config.tie_word_embeddings:
                head = target_model.get_output_embeddings().weight
                model.get_output_embeddings().weight.copy_(head.float())
    return model


def vocab_map_bytes(d2t: torch.Tensor, t2d: torch.Tensor) -> bytes:
    """The draft vocabulary map as the file a draft LM ships it in."""
    from safetensors.torch import save

    return save({"d2t": d2t.long().contiguous(), "t2d": t2d.bool().contiguous()})


def install_draft_vocab(model, data: bytes, where: str) -> None:
    """Make the draft LM `model` draft through the rows of its head that the map `data` (a
    `DRAFT_VOCAB_FILE`'s bytes) keeps; a map that is not one of its vocabulary is refused."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    from .drafter_io import DrafterError
    from .target_head import DraftVocabHead, check_vocab_map

    try:
        tensors = load(data)
    except (SafetensorError, OSError) as err:
        raise DrafterError(f"{where} cannot be read: {err}") from err
    if set(tensors) != {"d2t", "t2d"}:
        found = ", ".join(tensors) or "nothing"
        raise DrafterError(f"{where}: a draft vocabulary map holds d2t and t2d, not {found}")
    head = model.get_output_embeddings()
    vocab = head.weight.shape[0]
    check_vocab_map(tensors["d2t"], tensors["t2d"], vocab, where)
    model.set_output_embeddings(DraftVocabHead(head, tensors["d2t"]))


def export_hf(export) -> None:
    """The draft LM as the plain transformers checkpoint it is (the family's `hf` export)."""
    config = {**export.config, "draftzoo": {"family": export.record["family"]}}
    note = export.draft_vocabulary_note()
    if note:
        config["draftzoo"]["draft_vocabulary"] = note
    (export.folder / "config.json").write_text(json.dumps(config))
    shutil.copy2(export.source / "model.safetensors", export.folder / "model.safetensors")


def export_gguf(export) -> None:
    """The draft LM -> its transformers checkpoint -> a plain llama.cpp GGUF sharing the
    target's vocabulary (gguf_export.py)."""
    from .gguf_export import convert_with_llama_cpp

    convert_with_llama_cpp(export, "hf", export_hf, False, "draft-simple")


def import_hf(peer, target):
    """A plain transformers causal LM folder -> a draft LM (the family's `hf` importer): its
    config and tensors as they are, its tokenizer files copied (the loader checks they are the
    target's vocabulary). None when the tensors are not the config's model's."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from .export import TOKENIZER_FILES
    from .peer_import import Imported, PeerImportError, named_verifier

    config = dict(peer.config)
    if config.get("model_type") not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return None
    expected = _state_keys(config)
    if expected is None or not peer.keys <= expected or not _covers(peer.keys, expected):
        return None
    copied = tuple(name for name in TOKENIZER_FILES if (peer.path / name).is_file())
    if "tokenizer.json" not in copied and "tokenizer_config.json" not in copied:
        raise PeerImportError(
            f"{peer.path}: a draft model needs its tokenizer files beside it, to check that it "
            "shares the target's vocabulary"
        )
    config.pop("draftzoo", None)
    tensors = dict(peer.tensors)
    name = "/".join(peer.architectures()) or config["model_type"]
    return Imported(
        "draft_lm",
        f"transformers {name}",
        config,
        tensors,
        [],
        named_verifier(peer),
        copy_files=copied,
    )


def _state_keys(config: dict) -> set[str] | None:
    """The state-dict keys of the model `config` builds (on the meta device)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k not in ("auto_map",)}
    try:
        built = AutoConfig.for_model(**fields)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(built)
    except Exception:  # not a config transformers builds: not this layout
        return None
    return set(model.state_dict())


def _covers(keys: set[str], expected: set[str]) -> bool:
    """Every expected tensor present, but a tied output head (stored once)."""
    return all(k in keys or k.endswith("lm_head.weight") for k in expected)
