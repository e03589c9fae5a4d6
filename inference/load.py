"""Loading a drafter — by zoo name or folder — into a ready speculative generator.

    import draftzoo
    generator = draftzoo.load("eagle3-testbed-small")          # its target from the record
    generator = draftzoo.load("runs/my-drafter", target="meta-llama/Llama-3.1-8B-Instruct")
    print(generator.generate("def fib(n):").text)

The drafter's target fingerprint (architecture, hidden size, layers, vocabulary, tokenizer) is
checked against the target before anything runs; a mismatch is refused naming both sides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from ..architectures.defaults import NUM_SPECULATIVE_TOKENS, target_location
from ..architectures.drafter_io import DrafterError, check_drafter_target, read_drafter_record
from ..architectures.eagle import KINDS as EAGLE_KINDS
from ..architectures.lora_adapter import adapter_dir, merge_adapter
from ..architectures.medusa import FAMILIES as MEDUSA_FAMILIES
from ..architectures.medusa import medusa_head_count
from ..architectures.target import FingerprintMismatchError, TargetAdapter
from ..architectures.zoo_index import find_in_zoos
from .eagle import EagleProposer, TreeSettings
from .errors import GenerationError
from .generate import SpeculativeGenerator
from .medusa import MedusaProposer, MedusaTree, calibrated_tree, resolve_medusa_tree
from .mtp import MtpProposer
from .proposers import (
    DraftModelProposer,
    PromptLookupProposer,
    Proposer,
    ProposerError,
    vocabularies_match,
)

TREE_FAMILIES = (*EAGLE_KINDS, *MEDUSA_FAMILIES)
#: `load(num_speculative_tokens=AS_PUBLISHED)`: the length the drafter's zoo entry serves with
AS_PUBLISHED = "published"


@dataclass
class DrafterRuntime:
    """A loaded drafter: its module, how it proposes, and where it came from."""

    folder: Path
    record: dict[str, Any]
    module: nn.Module  # the drafter's own weights (shared target weights excluded)
    make_proposer: Callable[[], Proposer]  # one per request (proposers keep per-request state)
    num_speculative_tokens: int | None  # chain length, or tree depth; None: adaptive
    proposal: str  # "chain" or "tree"
    tree: TreeSettings | MedusaTree | None = None  # the tree it drafts, when it drafts trees

    @property
    def family(self) -> str:
        return self.record["family"]


def resolve_drafter(name_or_path: str | Path, zoos: list[Path] | None = None):
    """(folder, zoo entry or None): a drafter folder as given, else a name in the zoo."""
    path = Path(name_or_path)
    if path.is_dir():
        return path, None
    return find_in_zoos(str(name_or_path), zoos)


def load_target(name_or_path: str, dtype: torch.dtype = torch.float32, device=None):
    """(model, tokenizer) of a target by folder or hub name, in eval mode."""
    from transformers import AutoTokenizer

    from ..architectures.safe_load import load_causal_lm

    location = target_location(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(location)
    model = load_causal_lm(location, dtype=dtype)
    if device is not None:
        model = model.to(device)
    return model.eval(), tokenizer


def recorded_target(record: dict[str, Any]) -> str:
    """The target a drafter was trained for, as its recipe names it; a record that names none
    is an error (pass the target explicitly)."""
    path = record.get("recipe", {}).get("target", {}).get("path")
    if not path:
        raise DrafterError(
            "the drafter's record names no target it was trained for; pass the target "
            "explicitly (--target, or load(..., target=...))"
        )
    return str(path)


def load_drafter(
    folder: Path,
    target,
    tokenizer,
    proposal: str = "chain",
    num_speculative_tokens: int | None = NUM_SPECULATIVE_TOKENS,
    tree: TreeSettings | MedusaTree | None = None,
    static_cache: bool = False,
) -> DrafterRuntime:
    """A drafter folder loaded for `target` (a transformers causal LM), fingerprint-checked.

    `proposal`: "chain", or "tree" (EAGLE: EAGLE-2 dynamic trees, `TreeSettings`; Medusa:
    a static `MedusaTree`, its calibrated or default one when none is given); a tree's depth
    then sets the speculation length unless that is None (adaptive). A Medusa-2 drafter merges
    its LoRA adapter into `target` (in place). `static_cache`: the proposers keep
    preallocated caches and replay their forwards as CUDA graphs on CUDA."""
    folder = Path(folder)
    record = read_drafter_record(folder)
    family = record["family"]
    if proposal not in ("chain", "tree"):
        raise ProposerError(f"proposal must be 'chain' or 'tree', got {proposal!r}")
    if proposal == "tree" and family not in TREE_FAMILIES:
        raise ProposerError(
            f"a {family} drafter drafts chains only; trees need an EAGLE or Medusa drafter"
        )
    builders = {
        "draft_lm": _draft_lm,
        "eagle1": _eagle,
        "eagle3": _eagle,
        "medusa1": _medusa,
        "medusa2": _medusa,
        "mtp": _mtp,
    }
    if family not in builders:
        raise DrafterError(f"{folder}: unknown drafter family {family!r}")
    if proposal == "chain":
        tree = None
        _check_chain_length(folder, family, num_speculative_tokens)
    elif tree is None:
        tree = TreeSettings()  # the family's default tree
    try:
        module, make, tree = builders[family](folder, target, tokenizer, tree, static_cache)
    except FingerprintMismatchError as err:
        given = getattr(target.config, "_name_or_path", "") or type(target).__name__
        raise FingerprintMismatchError(
            f"drafter {folder} was trained for target {recorded_target(record)!r}, "
            f"not for {given!r}: {err}"
        ) from err
    if proposal == "tree" and num_speculative_tokens is not None:
        num_speculative_tokens = tree.depth
    return DrafterRuntime(folder, record, module, make, num_speculative_tokens, proposal, tree)


def _check_chain_length(folder: Path, family: str, length: int | None) -> None:
    """Medusa heads draft one token each: a longer chain is refused, not cut short."""
    if family not in MEDUSA_FAMILIES or length is None:
        return
    heads = medusa_head_count(folder)
    if length > heads:
        raise ProposerError(
            f"drafter {folder} has {heads} Medusa heads, so its chains are at most {heads} "
            f"tokens long; asked for {length}"
        )


def _draft_lm(folder, target, tokenizer, tree, static_cache):
    """(module, proposer factory, None) of a draft LM sharing the target's tokenizer."""
    from transformers import AutoTokenizer

    from ..architectures.safe_load import load_causal_lm

    check_drafter_target(folder, TargetAdapter(target, tokenizer).fingerprint())
    if not vocabularies_match(AutoTokenizer.from_pretrained(folder), tokenizer):
        raise ProposerError(f"drafter {folder} does not share the target's tokenizer")
    device = next(target.parameters()).device
    if not (Path(folder) / "model.safetensors").is_file():
        raise DrafterError(
            f"drafter {folder} has no model.safetensors; draftzoo reads drafters as safetensors "
            "and JSON only (a pickle-based file such as pytorch_model.bin could run code)"
        )
    draft = load_causal_lm(folder, dtype=target.dtype)
    draft = draft.to(device).eval()

    def make() -> Proposer:
        return DraftModelProposer(draft, None, None, static_cache=static_cache)

    return draft, make, None


def _eagle(folder, target, tokenizer, tree, static_cache):
    """(module, proposer factory, tree) of an EAGLE-1/3 drafter; trees are EAGLE-2's."""
    if isinstance(tree, MedusaTree):
        raise ProposerError("a MedusaTree does not apply to an EAGLE drafter (TreeSettings)")
    drafter = EagleProposer.from_pretrained(folder, target, tokenizer).drafter

    def make() -> Proposer:
        return EagleProposer(drafter, tree, static_cache=static_cache)

    return drafter, make, tree


def _medusa(folder, target, tokenizer, tree, static_cache):
    """(module, proposer factory, tree) of Medusa heads; trees are static `MedusaTree`s (the
    drafter's calibrated one unless another is named). A Medusa-2 drafter's adapter is merged
    into `target` in place: its heads are verified by the adapted target."""
    chain = MedusaProposer.from_pretrained(folder, target, tokenizer)
    record = read_drafter_record(folder)
    if tree is not None:
        tree = resolve_medusa_tree(tree, chain.heads.num_heads, calibrated_tree(record))

    def make() -> Proposer:
        return MedusaProposer(chain.heads, chain.target_layers[0], tree, static_cache)

    make()  # a tree the heads cannot draft is refused before the target is touched
    if record["family"] == "medusa2":
        merge_adapter(target, adapter_dir(folder))

    return chain.heads, make, tree


def _mtp(folder, target, tokenizer, tree, static_cache):
    """(module, proposer factory, None) of MTP modules (chains only)."""
    drafter = MtpProposer.from_pretrained(folder, target, tokenizer).drafter

    def make() -> Proposer:
        return MtpProposer(drafter, static_cache=static_cache)

    return drafter, make, None


#: the family name of the training-free n-gram proposer in reports
PROMPT_LOOKUP = "prompt_lookup"


def prompt_lookup_runtime(
    num_speculative_tokens: int = NUM_SPECULATIVE_TOKENS, min_ngram: int = 1, max_ngram: int = 3
) -> DrafterRuntime:
    """Prompt lookup (n-gram copying, no weights) as a runtime `draftzoo.eval` can measure."""

    def make() -> Proposer:
        return PromptLookupProposer(min_ngram, max_ngram)

    record = {"family": PROMPT_LOOKUP, "ngram": [min_ngram, max_ngram], "training": {}}
    return DrafterRuntime(
        Path(PROMPT_LOOKUP), record, nn.Module(), make, num_speculative_tokens, "chain"
    )


def load(
    name_or_path: str | Path,
    target=None,
    tokenizer=None,
    *,
    proposal: str | None = None,
    num_speculative_tokens: int | Literal["published"] | None = AS_PUBLISHED,
    tree: TreeSettings | MedusaTree | None = None,
    dtype: torch.dtype = torch.float32,
    device=None,
    zoos: list[Path] | None = None,
    static_cache: bool = False,
) -> SpeculativeGenerator:
    """A `SpeculativeGenerator` for a published drafter (zoo name) or a drafter folder.

    `target`: a transformers causal LM, or its folder / hub name; None loads the target the
    drafter was trained for (a record that names none needs `target`). `proposal` /
    `num_speculative_tokens` / `tree` default to the settings the drafter's published
    evaluation used (a chain of `NUM_SPECULATIVE_TOKENS` when unpublished);
    `num_speculative_tokens=None` chooses the length every round from the measured acceptance
    and draft/verify cost (`AdaptiveLength`).
    `static_cache`: preallocated KV caches for the target and the drafter, whose decode
    forwards replay as CUDA graphs on a GPU.
    """
    folder, entry = resolve_drafter(name_or_path, zoos)
    record = read_drafter_record(folder)
    serving = (entry or {}).get("serving", {})
    if target is None or isinstance(target, str | Path):
        target, loaded_tokenizer = load_target(
            str(target or recorded_target(record)), dtype, device
        )
        tokenizer = tokenizer or loaded_tokenizer
    elif tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(target.config._name_or_path)
    if tree is None and serving.get("tree"):
        tree = _published_tree(record["family"], serving["tree"])
    runtime = load_drafter(
        folder,
        target,
        tokenizer,
        proposal or serving.get("proposal", "chain"),
        _speculative_tokens(num_speculative_tokens, serving),
        tree,
        static_cache,
    )
    generator = SpeculativeGenerator(
        target,
        tokenizer,
        runtime.make_proposer(),
        runtime.num_speculative_tokens,
        static_cache=static_cache,
    )
    generator.drafter = runtime
    return generator


def _speculative_tokens(asked: int | str | None, serving: dict[str, Any]) -> int | None:
    """The fixed length `load` was asked for, None for adaptive, or the published one."""
    if asked == AS_PUBLISHED:
        return serving.get("num_speculative_tokens", NUM_SPECULATIVE_TOKENS)
    if asked is not None and (not isinstance(asked, int) or asked < 1):
        raise GenerationError(
            f"num_speculative_tokens must be an int >= 1, None (adaptive) or {AS_PUBLISHED!r}; "
            f"got {asked!r}"
        )
    return asked


def _published_tree(family: str, settings: dict[str, Any]) -> TreeSettings | MedusaTree:
    """A zoo entry's serving tree as the family's settings object."""
    if family in MEDUSA_FAMILIES:
        return MedusaTree(tuple(tuple(path) for path in settings["choices"]))
    return TreeSettings(**settings)
