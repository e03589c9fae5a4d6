"""Loading a drafter — by zoo name or folder — into a ready speculative generator.

    import draftzoo
    generator = draftzoo.load("eagle3-testbed-small")          # its target from the record
    generator = draftzoo.load("runs/my-drafter", target="meta-llama/Llama-3.1-8B-Instruct")
    print(generator.generate("def fib(n):").text)

The drafter's target fingerprint (architecture, hidden size, layers, vocabulary, tokenizer) is
checked against the target before anything runs; a mismatch is refused naming both sides.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from ..architectures.defaults import target_location
from ..architectures.drafter_files import DrafterFiles
from ..architectures.drafter_io import DrafterError
from ..architectures.errors import DraftzooError
from ..architectures.families import UnknownFamilyError, family_spec
from ..architectures.target import FingerprintMismatchError
from ..architectures.zoo_index import ZooError, resolve_drafter
from .cache_settings import GROWING, CacheSettings
from .drafter_request import DrafterRequest, LoadedDrafter
from .drafter_runtime import DrafterRuntime
from .generate import SpeculativeGenerator
from .model_free import ModelFreeSpec
from .peer_import import drafter_from_peer
from .proposal_settings import ProposalSettings, asked, check_family_tree, from_serving
from .proposer import Proposer
from .proposers.hybrid import HybridProposer, HybridSettings
from .proposers.suffix import SuffixSettings
from .proposers.suffix_store import global_cache

#: `load(num_speculative_tokens=AS_PUBLISHED)`: the length the drafter's zoo entry serves with
AS_PUBLISHED = "published"


def load_target(name_or_path: str, dtype: torch.dtype = torch.float32, device=None):
    """(model, tokenizer) of a target by folder or hub name, in eval mode."""
    from ..architectures.safe_load import load_causal_lm, load_tokenizer

    location = target_location(name_or_path)
    tokenizer = load_tokenizer(location)
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
    settings: ProposalSettings | None = None,
    cache: CacheSettings = GROWING,
    files: DrafterFiles | None = None,
) -> DrafterRuntime:
    """A drafter folder loaded for `target` (a transformers causal LM), fingerprint-checked,
    proposing as `settings` ask (default: a chain of `NUM_SPECULATIVE_TOKENS`); a tree's depth
    then sets the speculation length unless that is None (adaptive). A family that adapts the
    target (Medusa-2) changes `target` in place. `cache`: how the proposers keep their caches
    (`CacheSettings`). `files`: the folder as the caller opened it already (`DrafterFiles`:
    its record and files read once; the module is built from those very bytes, whose hash the
    runtime carries)."""
    folder = Path(folder)
    settings = settings or ProposalSettings()
    files = files if files is not None else DrafterFiles.open(folder)
    record = files.record
    try:
        spec = family_spec(record["family"])
    except UnknownFamilyError as err:
        raise DrafterError(f"{folder}: {err}") from err
    check_family_tree(settings, spec)
    request = DrafterRequest(settings, cache, files)
    loaded = _load_module(spec, folder, record, target, tokenizer, request)
    files.release()  # the module holds its tensors; the bytes would double the memory
    if settings.drafts_tree:
        depth = loaded.tree.depth if settings.num_speculative_tokens is not None else None
        settings = replace(settings, tree=loaded.tree, num_speculative_tokens=depth)
    if settings.hybrid is not None:
        runtime = hybrid_runtime(folder, record, loaded, settings, tokenizer)
    else:
        runtime = DrafterRuntime(folder, record, loaded.module, loaded.make_proposer, settings)
    runtime.sha256 = files.sha256
    return runtime


def _load_module(spec, folder, record, target, tokenizer, request) -> LoadedDrafter:
    """The family's loader on the folder; whatever in the folder's files builds no module is
    one line naming the folder."""
    try:
        return spec.runtime_loader()(folder, record, target, tokenizer, request)
    except FingerprintMismatchError as err:
        given = getattr(target.config, "_name_or_path", "") or type(target).__name__
        raise FingerprintMismatchError(
            f"drafter {folder} was trained for target {recorded_target(record)!r}, "
            f"not for {given!r}: {err}"
        ) from err
    except DraftzooError:
        raise
    except Exception as err:  # the folder is untrusted input
        # a wrong shape, an absurd or missing config value (transformers' configs validate
        # with their own error types): the files' fault, in one line (-v shows the traceback)
        said = " ".join(str(err).split())
        raise DrafterError(
            f"{folder} does not load as a drafter of family {spec.display_name}: "
            f"{type(err).__name__}: {said[:300]}"
        ) from err


def hybrid_runtime(
    folder: Path,
    record: dict[str, Any],
    loaded: LoadedDrafter,
    settings: ProposalSettings,
    tokenizer=None,
) -> DrafterRuntime:
    """A loaded drafter whose every request's proposer is a `HybridProposer` over it, all
    sharing one global suffix cache (emptied before each measured pass; kept in a file when
    the settings name one, which needs the target's `tokenizer`)."""
    cache = global_cache(settings.hybrid.suffix, tokenizer)

    def make() -> Proposer:
        return HybridProposer(loaded.make_proposer(), settings.hybrid, cache)

    return DrafterRuntime(folder, record, loaded.module, make, settings, cache.clear)


class LoadArgumentError(DraftzooError, TypeError):
    """An argument of `draftzoo.load` of the wrong kind."""


def _check_load_arguments(name_or_path, target, dtype, device) -> None:
    """`load`'s arguments, checked where they enter: each wrong one is one line."""
    if not isinstance(name_or_path, str | Path):
        raise LoadArgumentError(
            f"the drafter is a zoo name or a folder, not {type(name_or_path).__name__}"
        )
    if target is not None and not isinstance(target, str | Path | nn.Module):
        raise LoadArgumentError(
            f"target is a transformers causal LM or its folder or hub name, not "
            f"{type(target).__name__}"
        )
    if not isinstance(dtype, torch.dtype):
        raise LoadArgumentError(f"dtype is a torch.dtype, not {dtype!r}")
    if device is not None:
        try:
            if torch.device(device).type == "cuda" and not torch.cuda.is_available():
                raise RuntimeError("no CUDA device here")
        except (RuntimeError, TypeError) as err:
            raise LoadArgumentError(
                f"device {device!r} is not a device (cpu, cuda, cuda:N)"
            ) from err


def load(
    name_or_path: str | Path,
    target=None,
    tokenizer=None,
    *,
    proposal: ProposalSettings | str | None = None,
    num_speculative_tokens: int | Literal["published"] | None = AS_PUBLISHED,
    tree: Any = None,
    dtype: torch.dtype = torch.float32,
    device=None,
    zoos: list[Path] | None = None,
    cache: CacheSettings = GROWING,
    suffix: SuffixSettings | None = None,
    hybrid: HybridSettings | None = None,
) -> SpeculativeGenerator:
    """A `SpeculativeGenerator` for a published drafter (zoo name) or a drafter folder.

    `target`: a transformers causal LM, or its folder / hub name; None loads the target the
    drafter was trained for (a record that names none needs `target`). How it proposes
    defaults to the settings the drafter's published evaluation used (a chain of
    `NUM_SPECULATIVE_TOKENS` when unpublished); `proposal` replaces them (a
    `ProposalSettings`, or a kind's name: "chain", "tree", "hybrid", "hybrid-tree"), and each
    keyword given replaces its part: `num_speculative_tokens` (None: chosen every round from
    the measured acceptance and draft/verify cost, `AdaptiveLength`), `tree` (a tree of the
    family's kind, e.g. `TreeSettings(top_k=8)` for EAGLE, `PositionTree(...)` for Medusa and
    DFlash), `hybrid` (e.g. `HybridSettings(pace=False)`: by scores alone, untimed), `suffix`
    (the hybrid's suffix settings, e.g. `SuffixSettings(tree=True, cache_path="cache.json")`
    to keep what earlier processes generated).
    `cache`: how the target's and the drafter's KV caches are kept, e.g.
    `CacheSettings(static=True, max_length=4096)`: buffers allocated once, whose decode
    forwards replay as CUDA graphs on a GPU."""
    _check_load_arguments(name_or_path, target, dtype, device)
    folder, entry = _drafter_folder(name_or_path, zoos, target)
    files = DrafterFiles.open(folder)
    record = files.record
    published = _published(entry, record)
    settings = asked(
        published, proposal, num_speculative_tokens, tree, hybrid, suffix, AS_PUBLISHED
    )
    if target is None or isinstance(target, str | Path):
        target, loaded_tokenizer = load_target(
            str(target or recorded_target(record)), dtype, device
        )
        tokenizer = tokenizer or loaded_tokenizer
    elif tokenizer is None:
        from ..architectures.safe_load import load_tokenizer

        tokenizer = load_tokenizer(target.config._name_or_path)
    runtime = load_drafter(folder, target, tokenizer, settings, cache, files)
    generator = SpeculativeGenerator(
        target, tokenizer, runtime.make_proposer(), runtime.num_speculative_tokens, cache
    )
    generator.drafter = runtime
    return generator


def _published(entry: dict[str, Any] | None, record: dict[str, Any]) -> ProposalSettings | None:
    """The settings a zoo entry was measured with (None: not a zoo entry)."""
    if entry is None or "serving" not in entry:
        return None
    try:
        tree_kind = family_spec(record["family"]).tree_class()
    except UnknownFamilyError:
        tree_kind = None
    try:
        return from_serving(entry["serving"], tree_kind)
    except DraftzooError as err:
        raise ZooError(f"a zoo entry's {err}") from err


def _drafter_folder(name_or_path, zoos, target) -> tuple[Path, dict[str, Any] | None]:
    """(drafter folder, zoo entry or None); a folder in a peer's layout is converted for the
    target (once, into the import cache)."""
    folder, entry = resolve_drafter(name_or_path, zoos)
    named = str(target) if isinstance(target, str | Path) else None
    return drafter_from_peer(folder, named), entry


def build_generator(
    target: str | None = None,
    drafter: str | Path | None = None,
    draft_model: str | None = None,
    model_free: tuple[ModelFreeSpec, Any] | None = None,
    *,
    proposal: ProposalSettings | None = None,
    device: str | None = None,
    cache: CacheSettings = GROWING,
) -> SpeculativeGenerator:
    """The generator `draftzoo generate` runs: a draftzoo `drafter` (folder or zoo name; its
    own target by default) proposing as `proposal` asks (None: as published), a plain
    `draft_model` (any causal LM on the target's tokenizer), a `model_free` proposer (its spec
    and settings), or target-only decoding when none is given."""

    from ..architectures.defaults import COMMITTED_TARGET
    from ..architectures.safe_load import load_causal_lm, load_tokenizer
    from .proposer import ProposerError
    from .proposers.draft_lm import DraftModelProposer

    if drafter is not None:
        return load(drafter, target, proposal=proposal, device=device, cache=cache)
    proposal = proposal or ProposalSettings(num_speculative_tokens=None)
    if proposal.hybrid is not None or (proposal.drafts_tree and model_free is None):
        raise ProposerError(f"a {proposal.kind} proposal needs a drafter (--drafter)")
    model, tokenizer = load_target(target or COMMITTED_TARGET, device=device)
    proposer = None
    if model_free is not None:
        spec, settings = model_free
        proposer = spec.build(settings, proposal, tokenizer).make_proposer()
    elif draft_model is not None:
        location = target_location(draft_model)
        draft = load_causal_lm(location, dtype=torch.float32).to(model.device)
        proposer = DraftModelProposer(draft, load_tokenizer(location), tokenizer, cache)
    n = proposal.num_speculative_tokens
    return SpeculativeGenerator(model, tokenizer, proposer, n, cache)
