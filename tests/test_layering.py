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
    """{dotted module name: file} of every package module."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path
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
