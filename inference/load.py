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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from ..architectures.defaults import NUM_SPECULATIVE_TOKENS, target_location
from ..architectures.drafter_io import DrafterError, checkpoint_hash, read_drafter_record
from ..architectures.errors import DraftzooError
from ..architectures.families import UnknownFamilyError, family_spec, family_specs
from ..architectures.target import FingerprintMismatchError
from ..architectures.zoo_index import ZooError, resolve_drafter
from .cache_settings import GROWING, CacheSettings
from .drafter_request import DrafterRequest, LoadedDrafter
from .errors import GenerationError
from .generate import SpeculativeGenerator
from .hybrid import HybridProposer, HybridSettings
from .peer_import import drafter_from_peer
from .position_tree import PositionTree
from .proposers import PromptLookupProposer, Proposer, ProposerError
from .suffix import SuffixCache, SuffixProposer, SuffixSettings
from .suffix_store import global_cache
from .tree import TreeSettings

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
    tree: TreeSettings | PositionTree | None = None  # the tree it drafts, when it drafts trees
    #: called before each measured pass (a temperature, batch size and repeat of `draftzoo
    #: eval`): a proposer that learns across requests forgets earlier passes, so one pass's
    #: prompts never draft from another pass's answers to the same prompts
    begin_pass: Callable[[], None] = lambda: None
    #: the checkpoint hash of the files the module was built from (read before and after)
    sha256: str | None = None
    #: a hybrid's rule, as reports record it (`HybridSettings.rule`); None for other proposals
    hybrid_rule: dict[str, Any] | None = None

    @property
    def family(self) -> str:
        return self.record["family"]


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
    proposal: str = "chain",
    num_speculative_tokens: int | None = NUM_SPECULATIVE_TOKENS,
    tree: TreeSettings | PositionTree | dict | None = None,
    cache: CacheSettings = GROWING,
    record: dict[str, Any] | None = None,
    suffix: SuffixSettings | None = None,
    hybrid: HybridSettings | None = None,
) -> DrafterRuntime:
    """A drafter folder loaded for `target` (a transformers causal LM), fingerprint-checked.

    `proposal`: "chain", "hybrid" / "hybrid-tree" (its chain / tree with suffix decoding's
    branches, `HybridProposer`) or "tree" for a family that drafts trees (EAGLE: EAGLE-2 dynamic
    trees, `TreeSettings`; Medusa and DFlash: a static `PositionTree`, its calibrated or
    default one when none is given; a zoo entry's published settings as a dict); a tree's
    depth then sets the
    speculation length unless that is None (adaptive). A family that adapts the target
    (Medusa-2) changes `target` in place. `cache`: how the proposers keep their caches
    (`CacheSettings`). `record`: the drafter's record when the caller has read it already.
    `suffix`: a hybrid's suffix decoding settings (default: trees of continuations, the global
    cache in memory); `hybrid`: the hybrid's rule (`HybridSettings`; `suffix`, when given,
    replaces its suffix settings)."""
    folder = Path(folder)
    settings = _hybrid_settings(proposal, hybrid, suffix)
    record = read_drafter_record(folder) if record is None else record
    try:
        spec = family_spec(record["family"])
    except UnknownFamilyError as err:
        raise DrafterError(f"{folder}: {err}") from err
    drafted = HYBRIDS.get(proposal, proposal)  # what the drafter itself proposes
    request = DrafterRequest(drafted, num_speculative_tokens, tree, cache)
    if drafted == "tree" and not spec.drafts_trees:
        tree_families = [s.display_name for s in family_specs().values() if s.drafts_trees]
        what = "trees" if proposal == "tree" else "hybrid trees (suffix branches in its tree)"
        raise ProposerError(
            f"a {spec.display_name} drafter drafts chains only; {what} need one of: "
            f"{', '.join(tree_families)}"
        )
    loaded, digest = _load_hashed(spec, folder, record, target, tokenizer, request)
    if request.proposal == "tree" and num_speculative_tokens is not None:
        num_speculative_tokens = loaded.tree.depth
    if settings is not None:
        runtime = hybrid_runtime(
            folder, record, loaded, num_speculative_tokens, proposal, settings, tokenizer
        )
    else:
        runtime = DrafterRuntime(
            folder,
            record,
            loaded.module,
            loaded.make_proposer,
            num_speculative_tokens,
            proposal,
            loaded.tree,
        )
    runtime.sha256 = digest
    return runtime


def _load_hashed(spec, folder, record, target, tokenizer, request) -> tuple[LoadedDrafter, str]:
    """The loaded module and the checkpoint hash of the files it was built from (hashed before
    and after reading them: a folder that changed meanwhile is refused)."""
    try:
        digest = checkpoint_hash(folder)  # the files about to be read
    except DrafterError:
        digest = None  # a file is missing: the family's loader says which, in its own words
    loaded = _load_module(spec, folder, record, target, tokenizer, request)
    if digest is None or checkpoint_hash(folder) != digest:
        raise DrafterError(f"{folder} changed while it was being loaded; load it again")
    return loaded, digest


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


def _hybrid_settings(
    proposal: str, hybrid: HybridSettings | None, suffix: SuffixSettings | None
) -> HybridSettings | None:
    """A hybrid proposal's settings, `suffix` replacing their suffix settings when given; None
    for other proposals, which take no hybrid settings."""
    if proposal not in HYBRIDS:
        if hybrid is not None:
            raise ProposerError(f"hybrid settings are a hybrid proposal's, not {proposal!r}'s")
        return None
    settings = hybrid or HybridSettings()
    return settings if suffix is None else replace(settings, suffix=suffix)


#: proposals that merge suffix decoding's branches into what the drafter proposes: its chain
#: (any family) or its tree (families that draft trees)
HYBRIDS = {"hybrid": "chain", "hybrid-tree": "tree"}


def hybrid_runtime(
    folder: Path,
    record: dict[str, Any],
    loaded: LoadedDrafter,
    num_speculative_tokens: int | None,
    proposal: str,
    settings: HybridSettings,
    tokenizer=None,
) -> DrafterRuntime:
    """A loaded drafter whose every request's proposer is a `HybridProposer` over it, all
    sharing one global suffix cache (emptied before each measured pass; kept in a file when
    the settings name one, which needs the target's `tokenizer`)."""
    cache = global_cache(settings.suffix, tokenizer)

    def make() -> Proposer:
        return HybridProposer(loaded.make_proposer(), settings, cache)

    return DrafterRuntime(
        folder,
        record,
        loaded.module,
        make,
        num_speculative_tokens,
        proposal,
        loaded.tree,
        cache.clear,
        hybrid_rule=settings.rule(),
    )


#: the family name of training-free suffix decoding in reports
SUFFIX_DECODING = "suffix_decoding"
#: the proposers that need no drafter, by their family name in reports
MODEL_FREE = (PROMPT_LOOKUP, SUFFIX_DECODING)


def suffix_runtime(
    num_speculative_tokens: int | None = NUM_SPECULATIVE_TOKENS,
    settings: SuffixSettings | None = None,
    cache: SuffixCache | None = None,
    tokenizer=None,
) -> DrafterRuntime:
    """Suffix decoding (no weights) as a runtime `draftzoo.eval` can measure; every request's
    proposer shares the global `cache` (by default the one the settings describe)."""
    settings = settings or SuffixSettings()
    cache = cache if cache is not None else global_cache(settings, tokenizer)

    def make() -> Proposer:
        return SuffixProposer(settings, cache)

    record = {"family": SUFFIX_DECODING, "suffix": asdict(settings), "training": {}}
    proposal = "tree" if settings.tree else "chain"
    return DrafterRuntime(
        Path(SUFFIX_DECODING),
        record,
        nn.Module(),
        make,
        num_speculative_tokens,
        proposal,
        settings if settings.tree else None,
        cache.clear,
    )


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
    proposal: str | None = None,
    num_speculative_tokens: int | Literal["published"] | None = AS_PUBLISHED,
    tree: TreeSettings | PositionTree | None = None,
    dtype: torch.dtype = torch.float32,
    device=None,
    zoos: list[Path] | None = None,
    cache: CacheSettings = GROWING,
    suffix: SuffixSettings | None = None,
    hybrid: HybridSettings | None = None,
) -> SpeculativeGenerator:
    """A `SpeculativeGenerator` for a published drafter (zoo name) or a drafter folder.

    `target`: a transformers causal LM, or its folder / hub name; None loads the target the
    drafter was trained for (a record that names none needs `target`). `proposal` /
    `num_speculative_tokens` / `tree` default to the settings the drafter's published
    evaluation used (a chain of `NUM_SPECULATIVE_TOKENS` when unpublished);
    `num_speculative_tokens=None` chooses the length every round from the measured acceptance
    and draft/verify cost (`AdaptiveLength`).
    `cache`: how the target's and the drafter's KV caches are kept, e.g.
    `CacheSettings(static=True, max_length=4096)`: buffers allocated once, whose decode
    forwards replay as CUDA graphs on a GPU. Hybrid proposals: `suffix`, e.g.
    `SuffixSettings(tree=True, cache_path="suffix-cache.json")` to keep what earlier processes
    generated; `hybrid`, e.g. `HybridSettings(pace=False)`: by scores alone, untimed (default:
    the rule the published evaluation recorded)."""
    _check_load_arguments(name_or_path, target, dtype, device)
    folder, entry = _drafter_folder(name_or_path, zoos, target)
    record = read_drafter_record(folder)
    serving = (entry or {}).get("serving", {})
    if target is None or isinstance(target, str | Path):
        target, loaded_tokenizer = load_target(
            str(target or recorded_target(record)), dtype, device
        )
        tokenizer = tokenizer or loaded_tokenizer
    elif tokenizer is None:
        from ..architectures.safe_load import load_tokenizer

        tokenizer = load_tokenizer(target.config._name_or_path)
    runtime = load_drafter(
        folder,
        target,
        tokenizer,
        proposal or serving.get("proposal", "chain"),
        _speculative_tokens(num_speculative_tokens, serving),
        tree if tree is not None else serving.get("tree"),
        cache,
        record,
        suffix,
        hybrid if hybrid is not None else _published_rule(serving, proposal),
    )
    generator = SpeculativeGenerator(
        target, tokenizer, runtime.make_proposer(), runtime.num_speculative_tokens, cache
    )
    generator.drafter = runtime
    return generator


def _published_rule(serving: dict[str, Any], proposal: str | None) -> HybridSettings | None:
    """The hybrid rule a zoo entry was measured with, when it is served as measured (None:
    today's default rule)."""
    rule = serving.get("hybrid_rule")
    if rule is None or (proposal or serving.get("proposal")) not in HYBRIDS:
        return None
    try:
        return HybridSettings(**rule)
    except (TypeError, GenerationError) as err:
        raise ZooError(f"a zoo entry's serving.hybrid_rule {rule!r} is not a rule: {err}") from err


def _drafter_folder(name_or_path, zoos, target) -> tuple[Path, dict[str, Any] | None]:
    """(drafter folder, zoo entry or None); a folder in a peer's layout is converted for the
    target (once, into the import cache)."""
    folder, entry = resolve_drafter(name_or_path, zoos)
    named = str(target) if isinstance(target, str | Path) else None
    return drafter_from_peer(folder, named), entry


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


def build_generator(
    target: str | None = None,
    drafter: str | Path | None = None,
    draft_model: str | None = None,
    prompt_lookup: tuple[int, int] | None = None,
    suffix: SuffixSettings | None = None,
    *,
    proposal: str = "chain",
    num_speculative_tokens: int | None = None,
    tree: TreeSettings | None = None,
    device: str | None = None,
    cache: CacheSettings = GROWING,
    hybrid: HybridSettings | None = None,
) -> SpeculativeGenerator:
    """The generator `draftzoo generate` runs: a draftzoo `drafter` (folder or zoo name; its
    own target by default), a plain `draft_model` (any causal LM on the target's tokenizer),
    `prompt_lookup` n-grams (min, max), `suffix` decoding (beside a drafter: the hybrid's
    suffix settings), or target-only decoding when none is given.
    `num_speculative_tokens=None`: adaptive. `tree`: None serves a published drafter's tree."""

    from ..architectures.defaults import COMMITTED_TARGET
    from ..architectures.safe_load import load_causal_lm, load_tokenizer
    from .proposers import DraftModelProposer

    if drafter is not None:
        if suffix is not None and proposal not in HYBRIDS:
            raise ProposerError("suffix settings beside a drafter are a hybrid's (--hybrid)")
        return load(
            drafter,
            target,
            proposal=proposal,
            num_speculative_tokens=num_speculative_tokens,
            tree=tree,
            device=device,
            cache=cache,
            suffix=suffix,
            hybrid=hybrid,
        )
    if proposal != "chain":
        raise ProposerError("trees need a drafter that drafts them (--drafter)")
    model, tokenizer = load_target(target or COMMITTED_TARGET, device=device)
    proposer = None
    if prompt_lookup is not None:
        proposer = PromptLookupProposer(*prompt_lookup)
    elif suffix is not None:
        proposer = SuffixProposer(suffix, global_cache(suffix, tokenizer))
    elif draft_model is not None:
        location = target_location(draft_model)
        draft = load_causal_lm(location, dtype=torch.float32).to(model.device)
        proposer = DraftModelProposer(draft, load_tokenizer(location), tokenizer, cache)
    return SpeculativeGenerator(model, tokenizer, proposer, num_speculative_tokens, cache)
