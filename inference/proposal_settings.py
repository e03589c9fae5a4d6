"""How a drafter is asked to propose — one typed value — and its one codec.

    ProposalSettings()                                   a chain of 4 draft tokens
    ProposalSettings(num_speculative_tokens=None)         a chain whose length adapts each round
    ProposalSettings(tree=OWN_TREE)                       the tree the drafter's family drafts
    ProposalSettings(tree=PositionTree(((0,), (1,))))     that static tree (Medusa, DFlash)
    ProposalSettings(hybrid=HybridSettings())             its chain with model-free branches

A tree is one of the tree kinds that family specs name (`FamilySpec.tree_kind`): a frozen
dataclass with `OPTIONS` (its command-line flags, each the name of one field), `record()`,
`from_record()` and `describe()` (`TreeKind`). The codec below is the one place that turns the
value into CLI flags, an eval report's `config` and a zoo entry's `serving`, and back; no other
module spells a proposal kind.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol

from ..architectures.config_io import ConfigError
from ..architectures.defaults import NUM_SPECULATIVE_TOKENS
from ..architectures.families import FamilySpec, family_specs
from .proposer import ProposerError
from .proposers.hybrid_rule import HybridSettings
from .proposers.suffix import SuffixSettings
from .setting_flag import SettingFlag

CHAIN, TREE, HYBRID, HYBRID_TREE = "chain", "tree", "hybrid", "hybrid-tree"
#: every proposal kind by name (reports, zoo entries, `draftzoo.load(proposal=...)`)
KINDS = (CHAIN, TREE, HYBRID, HYBRID_TREE)


class TreeKind(Protocol):
    """What a tree a family drafts says about itself."""

    OPTIONS: ClassVar[tuple[SettingFlag, ...]]

    def record(self) -> dict[str, Any]:
        """Its settings as JSON values (reports, zoo entries)."""
        ...

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> TreeKind:
        """The tree `record` holds."""
        ...

    def describe(self) -> str:
        """A few words for tables ("tree (16 nodes)")."""
        ...


@dataclass(frozen=True)
class OwnTree:
    """The tree a drafter's family drafts unless told otherwise (EAGLE: the default EAGLE-2
    budget; Medusa: its calibrated tree, else the default; DFlash: the default cut to its
    block)."""

    def describe(self) -> str:
        return "tree"


OWN_TREE = OwnTree()


@dataclass(frozen=True)
class ProposalSettings:
    """How a drafter is asked to propose."""

    #: None: chains; `OWN_TREE`: the family's own tree; else a tree of the family's kind
    tree: Any = None
    #: draft tokens a round (a tree's depth replaces it once the tree is known); None: the
    #: length adapts every round to the measured acceptance and draft/verify cost (timed)
    num_speculative_tokens: int | None = NUM_SPECULATIVE_TOKENS
    #: model-free branches merged in by this rule (`HybridSettings`); None: the drafter alone
    hybrid: HybridSettings | None = None

    def __post_init__(self) -> None:
        n = self.num_speculative_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ProposerError(f"num_speculative_tokens must be an int >= 1 or None, got {n!r}")
        if self.hybrid is not None and not isinstance(self.hybrid, HybridSettings):
            raise ProposerError(f"hybrid settings are a HybridSettings, not {self.hybrid!r}")

    @property
    def drafts_tree(self) -> bool:
        return self.tree is not None

    @property
    def kind(self) -> str:
        """Its name: chain, tree, hybrid (a chain with branches) or hybrid-tree."""
        if self.hybrid is not None:
            return HYBRID_TREE if self.drafts_tree else HYBRID
        return TREE if self.drafts_tree else CHAIN

    def tree_record(self) -> dict[str, Any] | None:
        """The tree's own settings as records hold them (None: chains or the family's own tree
        not yet resolved)."""
        if not self.drafts_tree or self.tree is OWN_TREE:
            return None
        return self.tree.record()

    def clock_dependent(self) -> tuple[str, ...]:
        """What in this proposal a busy clock changes: besides the speedups, the tokens it
        proposes (and so tau, acceptance and which greedy rounds run) when it times rounds."""
        timed = []
        if self.num_speculative_tokens is None:
            timed.append("the adaptive speculation length (chosen from timed rounds)")
        if self.hybrid is not None and self.hybrid.pace:
            timed.append("the hybrid rule (it weighs timed rounds; --hybrid-by-scores does not)")
        return tuple(timed)

    def describe(self) -> str:
        """A few words for tables: "chain of 4", "tree (16 nodes)", "... + suffix branches"."""
        if self.drafts_tree:
            shown = self.tree.describe()
        else:
            shown = f"chain of {self.num_speculative_tokens or 'adaptive length'}"
        return shown + (" + suffix branches" if self.hybrid is not None else "")


def tree_kinds() -> dict[str, type]:
    """Every tree kind a registered family drafts, by its class name."""
    kinds = {}
    for spec in family_specs().values():
        kind = spec.tree_class()
        if kind is not None:
            kinds[kind.__name__] = kind
    return kinds


def check_family_tree(settings: ProposalSettings, spec: FamilySpec) -> None:
    """Refuse a tree `spec`'s family does not draft (naming the families that draft trees)
    or a tree of another kind than its own (naming its kind's flags)."""
    kind = spec.tree_class()
    if settings.drafts_tree and kind is None:
        tree_families = [s.display_name for s in family_specs().values() if s.tree_class()]
        what = "hybrid trees (branches in its tree)" if settings.hybrid else "trees"
        raise ProposerError(
            f"a {spec.display_name} drafter drafts chains only; {what} need one of: "
            f"{', '.join(tree_families)}"
        )
    if settings.tree not in (None, OWN_TREE) and not isinstance(settings.tree, kind):
        flags = ", ".join(option.flag for option in kind.OPTIONS)
        raise ProposerError(
            f"a {spec.display_name} drafter drafts trees of kind {kind.__name__} ({flags}), "
            f"not a {type(settings.tree).__name__}"
        )


# --- the codec: CLI flags ---------------------------------------------------------------------


def add_proposal_flags(parser: argparse.ArgumentParser, tree_help: str, hybrid_help: str) -> None:
    """--tree, --hybrid, --hybrid-by-scores and every tree kind's own flags (defaults None: the
    kind's own defaults, or the drafter's published tree)."""
    parser.add_argument("--tree", action="store_true", help=tree_help)
    parser.add_argument("--hybrid", action="store_true", help=hybrid_help)
    parser.add_argument(
        "--hybrid-by-scores",
        action="store_true",
        help="--hybrid: choose each round by measured accepted tokens alone, without timing "
        "rounds, so the proposal does not depend on the clock (with a fixed "
        "--num-speculative-tokens a --seed then fixes a sampled output)",
    )
    for kind in tree_kinds().values():
        for option in kind.OPTIONS:
            parser.add_argument(option.flag, type=option.parse, dest=option.dest, help=option.help)


def from_flags(
    args: argparse.Namespace, what: str = "draftzoo", suffix: SuffixSettings | None = None
) -> ProposalSettings:
    """The settings the parsed flags ask for (`suffix`: a hybrid's suffix settings, as trees
    of continuations; default: suffix decoding's defaults); a contradiction is a
    `ConfigError` naming the flags."""
    tree = _tree_from(vars(args))
    if tree is not None and not args.tree:
        given = [
            option.flag
            for kind in tree_kinds().values()
            for option in kind.OPTIONS
            if getattr(args, option.dest, None) is not None
        ]
        verb = "shapes" if len(given) == 1 else "shape"
        raise ConfigError(f"{what}: {', '.join(given)} {verb} a tree: also pass --tree")
    if args.hybrid_by_scores and not args.hybrid:
        raise ConfigError(f"{what}: --hybrid-by-scores sets the rule of --hybrid: add --hybrid")
    hybrid = None
    if args.hybrid:
        suffix = replace(suffix or SuffixSettings(), tree=True)
        hybrid = HybridSettings(suffix=suffix, pace=not args.hybrid_by_scores)
    return ProposalSettings(
        tree=(tree or OWN_TREE) if args.tree else None,
        num_speculative_tokens=args.num_speculative_tokens,
        hybrid=hybrid,
    )


def to_flags(settings: ProposalSettings) -> list[str]:
    """The flags `from_flags` reads back as `settings` (the hybrid's suffix settings and a rule
    other than the default or the scores' are not flags)."""
    flags = ["--hybrid"] if settings.hybrid is not None else []
    if settings.hybrid is not None and not settings.hybrid.pace:
        flags.append("--hybrid-by-scores")
    if settings.drafts_tree:
        flags.append("--tree")
        if settings.tree is not OWN_TREE:
            record = settings.tree.record()
            for option in settings.tree.OPTIONS:
                flags += [option.flag, _flag_text(record[option.field])]
    elif settings.num_speculative_tokens is not None:
        flags += ["--num-speculative-tokens", str(settings.num_speculative_tokens)]
    return flags


def _flag_text(value: Any) -> str:
    import json

    if isinstance(value, list | tuple):
        return json.dumps([list(v) if isinstance(v, tuple) else v for v in value], separators=",:")
    return str(value)


def _tree_from(given: Mapping[str, Any]) -> Any:
    """The tree whose flags `given` holds (flag names as parsed, or a report's flat config),
    None when it holds none; values equal to a kind's defaults in full ask for the family's
    own tree. Two kinds' flags at once are refused."""
    found = []
    for kind in tree_kinds().values():
        values = {o.field: given[o.dest] for o in kind.OPTIONS if given.get(o.dest) is not None}
        if values:
            found.append((kind, values))
    if len(found) > 1:
        flags = [o.flag for kind, _ in found for o in kind.OPTIONS]
        raise ConfigError(f"flags of different tree kinds given together: {', '.join(flags)}")
    if not found:
        return None
    kind, values = found[0]
    try:
        tree = kind.from_record(values)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"tree settings {values}: {err}") from err
    return tree


# --- the codec: a report's flat config --------------------------------------------------------


def config_record(settings: ProposalSettings) -> dict[str, Any]:
    """`settings` as an eval report's config holds them (flat, by flag name)."""
    record: dict[str, Any] = {
        "proposal": settings.kind,
        "num_speculative_tokens": settings.num_speculative_tokens,
    }
    if settings.drafts_tree and settings.tree is not OWN_TREE:
        values = settings.tree.record()
        record.update({o.dest: values[o.field] for o in settings.tree.OPTIONS})
    if settings.hybrid is not None:
        record["hybrid_rule"] = settings.hybrid.rule()
    return record


def from_config(config: Mapping[str, Any]) -> ProposalSettings:
    """The settings an eval report's config (this module's `config_record`, or the flat
    fields of earlier reports) holds."""
    kind = config.get("proposal", CHAIN)
    if kind not in KINDS:
        raise ConfigError(f"proposal must be one of {', '.join(KINDS)}, got {kind!r}")
    tree = None
    if kind in (TREE, HYBRID_TREE):
        tree = _own_if_default(_tree_from(config)) or OWN_TREE
    return ProposalSettings(
        tree=tree,
        num_speculative_tokens=config.get("num_speculative_tokens", NUM_SPECULATIVE_TOKENS),
        hybrid=_rule(config.get("hybrid_rule"), "config")
        if kind in (HYBRID, HYBRID_TREE)
        else None,
    )


def _own_if_default(tree: Any) -> Any:
    """A tree given with every setting at its kind's default is the family's own tree (earlier
    reports wrote EAGLE-2's defaults for every tree)."""
    if tree is None:
        return None
    try:
        return None if tree == type(tree)() else tree
    except TypeError:  # a kind with no defaults
        return tree


def _rule(rule: Any, where: str) -> HybridSettings:
    """A recorded hybrid rule (None: today's default rule); `where` names the record."""
    if rule is None:
        return HybridSettings()
    try:
        return HybridSettings(**rule)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}.hybrid_rule {rule!r} is not a rule: {err}") from err


# --- the codec: a zoo entry's (and a report's) serving ----------------------------------------


def serving_record(settings: ProposalSettings) -> dict[str, Any]:
    """How a drafter was served, as reports and zoo entries record it."""
    return {
        "proposal": settings.kind,
        "num_speculative_tokens": settings.num_speculative_tokens,
        "tree": settings.tree_record(),
        "hybrid_rule": settings.hybrid.rule() if settings.hybrid is not None else None,
    }


def from_serving(serving: Mapping[str, Any], tree_kind: type | None) -> ProposalSettings:
    """The settings a `serving` record holds; `tree_kind`: the kind its drafter drafts (None:
    chains only)."""
    kind = serving.get("proposal", CHAIN)
    if kind not in KINDS:
        raise ConfigError(f"serving.proposal must be one of {', '.join(KINDS)}, got {kind!r}")
    tree = None
    if kind in (TREE, HYBRID_TREE):
        recorded = serving.get("tree")
        if recorded is None or tree_kind is None:
            tree = OWN_TREE
        else:
            try:
                tree = tree_kind.from_record(recorded)
            except (TypeError, ValueError) as err:
                raise ConfigError(f"serving.tree {recorded!r} is not a tree: {err}") from err
    hybrid = None
    if kind in (HYBRID, HYBRID_TREE):
        hybrid = _rule(serving.get("hybrid_rule"), "serving")
    return ProposalSettings(
        tree=tree,
        num_speculative_tokens=serving.get("num_speculative_tokens", NUM_SPECULATIVE_TOKENS),
        hybrid=hybrid,
    )


def tree_kind_of(family: str) -> type | None:
    """The tree kind a drafter family or a model-free proposer drafts (None: chains only, or a
    name neither registry holds)."""
    from .model_free import model_free_specs

    spec = family_specs().get(family) or model_free_specs().get(family)
    return spec.tree_class() if spec is not None else None


def describe_serving(serving: Mapping[str, Any], family: str) -> str:
    """A serving record of a `family` drafter in a few words (leaderboards, summaries)."""
    return from_serving(serving, tree_kind_of(family)).describe()


#: `from_name` gives every length itself: no value is "as published"
_GIVEN = object()


def from_name(
    kind: str, num_speculative_tokens: int | None = NUM_SPECULATIVE_TOKENS, tree: Any = None
) -> ProposalSettings:
    """The settings a kind's name asks for ("chain", "tree", "hybrid", "hybrid-tree"; a tree
    kind: the family's own tree unless `tree` is given; a hybrid: the default rule)."""
    return asked(None, kind, num_speculative_tokens, tree, None, None, as_published=_GIVEN)


def asked(
    published: ProposalSettings | None,
    proposal: ProposalSettings | str | None,
    num_speculative_tokens: Any,
    tree: Any,
    hybrid: HybridSettings | None,
    suffix: SuffixSettings | None,
    as_published: object,
) -> ProposalSettings:
    """What `draftzoo.load` was asked for: `proposal` (a value, or a kind's name) over the
    `published` settings, then each keyword that was given (`as_published` for the length
    keeps the published one). The family's own tree of a drafter published with a tree is
    that tree."""
    base = published or ProposalSettings()
    if isinstance(proposal, ProposalSettings):
        settings = proposal
    elif proposal is None:
        settings = base
    elif proposal in KINDS:
        hybrid_kind = proposal in (HYBRID, HYBRID_TREE)
        keep_rule = base.hybrid if hybrid_kind else None
        wants_tree = proposal in (TREE, HYBRID_TREE)
        settings = ProposalSettings(
            tree=OWN_TREE if wants_tree else None,
            num_speculative_tokens=base.num_speculative_tokens,
            hybrid=(keep_rule or HybridSettings()) if hybrid_kind else None,
        )
    else:
        raise ProposerError(f"proposal must be one of {', '.join(KINDS)}, got {proposal!r}")
    if settings.tree is OWN_TREE and base.tree not in (None, OWN_TREE):
        settings = replace(settings, tree=base.tree)  # its own tree, as published
    if num_speculative_tokens != as_published:
        settings = replace(settings, num_speculative_tokens=num_speculative_tokens)
    if tree is not None:
        if not settings.drafts_tree:
            raise ProposerError(f"a tree is a tree proposal's, not a {settings.kind}'s")
        settings = replace(settings, tree=tree)
    if (hybrid is not None or suffix is not None) and settings.hybrid is None:
        raise ProposerError(f"hybrid settings are a hybrid proposal's, not a {settings.kind}'s")
    if hybrid is not None:
        settings = replace(settings, hybrid=hybrid)
    if suffix is not None:
        settings = replace(settings, hybrid=replace(settings.hybrid, suffix=suffix))
    return settings
