"""The house's shape: imports go one way between the subpackages, and no module imports itself
back through others. Every import counts, top-level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
FOLDERS = {
    "architectures": "draftzoo.architectures",
    "data": "draftzoo.data",
    "train": "draftzoo.train",
    "inference": "draftzoo.inference",
    "eval": "draftzoo.eval",
    "draftzoo": "draftzoo",
}
#: subpackage -> the subpackages it may import (besides itself): architectures <- data <- train,
#: architectures <- inference <- eval (eval also reads prompt sets from data); the CLI anything
ALLOWED = {
    "architectures": set(),
    "data": {"architectures"},
    "train": {"architectures", "data"},
    "inference": {"architectures"},
    "eval": {"architectures", "data", "inference"},
    "draftzoo": set(FOLDERS),
}


def _modules() -> dict[str, Path]:
    """{dotted module name: file} of every package module, its rooms' included."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((package, *parts))] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `name` imports (absolute or relative, at any depth of the file)."""
    package = name if path.stem == "__init__" else name.rsplit(".", 1)[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            candidates = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
        else:
            continue
        targets.update(c for c in candidates if c in known)
    targets.discard(name)
    return targets


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _subpackage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in FOLDERS else "draftzoo"


def test_imports_follow_the_layering():
    against = [
        f"{module} -> {target}"
        for module, targets in _graph().items()
        for target in targets
        if _subpackage(target) != _subpackage(module)
        and _subpackage(target) not in ALLOWED[_subpackage(module)]
        and target != "draftzoo"  # the root's lazy re-exports (e.g. __version__)
    ]
    assert not against, against


def test_no_import_circle():
    graph = _graph()
    circles, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                circles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, circles


#: the proposers' room inside the runtime (each family's proposer, the model-free ones)
ROOM = "draftzoo.inference.proposers"
#: the shared runtime's only reaches into the room, and what for
REACHES_INTO_THE_ROOM = {
    # the typed proposal value holds the hybrid's and suffix decoding's settings
    "draftzoo.inference.proposal_settings": {
        f"{ROOM}.hybrid_rule",
        f"{ROOM}.suffix",
    },
    # the loader assembles hybrids (a family's proposer beside the model-free ones) and serves
    # a plain draft model
    "draftzoo.inference.load": {
        f"{ROOM}.hybrid",
        f"{ROOM}.suffix",
        f"{ROOM}.suffix_store",
        f"{ROOM}.draft_lm",
    },
}


def test_the_shared_runtime_reaches_into_the_proposers_room_only_where_listed():
    """Arrows go from the room to the shared runtime; the runtime finds a family's proposer
    through the registry's strings, and reaches in by import only where listed above (and
    every listed reach is real, so the list cannot go stale)."""
    graph = _graph()
    shared = [m for m in graph if m.startswith("draftzoo.inference.") and not m.startswith(ROOM)]
    reaches = {m: {t for t in graph[m] if t.startswith(ROOM)} for m in shared}
    reaches = {m: targets for m, targets in reaches.items() if targets}
    assert reaches == REACHES_INTO_THE_ROOM


def test_every_proposer_lives_in_the_room():
    """Every family's runtime and every model-free proposer the registries name is a module of
    the room."""
    from draftzoo.architectures.families import family_specs
    from draftzoo.inference.model_free import MODEL_FREE_MODULES

    named = [spec.runtime.split(":")[0] for spec in family_specs().values()]
    named += list(MODEL_FREE_MODULES)
    outside = [module for module in named if not module.startswith(f"{ROOM}.")]
    assert not outside, outside
    assert set(named) <= set(_modules())


def test_the_checks_see_real_imports():
    """The graph is not empty: the CLI reaches every subpackage, train reaches data."""
    graph = _graph()
    assert "draftzoo.train.blocks" in graph["draftzoo.train.eagle"]
    assert "draftzoo.data.capture" in graph["draftzoo.train.blocks"]
    assert {_subpackage(t) for t in graph["draftzoo.cli"]} >= {"architectures", "train", "eval"}


#: functions that are argument tables (one `add_argument` after another), not logic
ARGUMENT_TABLES = {
    ("draftzoo.cli_parser", "build_parser"),
    ("draftzoo.cli_parser", "_add_zoo_commands"),
}
MAX_FUNCTION_LINES = 60


def test_no_function_is_longer_than_sixty_lines():
    """Small functions with one job: none of the package's is over 60 lines, argument tables
    aside."""
    long = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES and (name, node.name) not in ARGUMENT_TABLES:
                long.append(f"{name}.{node.name}: {lines} lines")
    assert not long, long
    assert all(name in _modules() for name, _ in ARGUMENT_TABLES)
