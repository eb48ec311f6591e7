"""The code base's imports as a graph, read from the source's import statements (those under
`if TYPE_CHECKING:` and inside functions too), for the layout tests (tests/test_layout.py,
tests/scheduler/test_layering.py)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("shared", "services", "inference", "shoal")


def modules(*packages: str) -> dict[str, Path]:
    """Every module of `packages` by its dotted name (a package by its own name)."""
    found = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that a file imports (`from a.b import c` is `a.b.c` when that is a
    module, else `a.b`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                found.add(_known(f"{node.module}.{alias.name}", known))
        elif isinstance(node, ast.Import):
            found.update(_known(alias.name, known) for alias in node.names)
    return found - {""}


def _known(name: str, known: dict[str, Path]) -> str:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


@functools.cache
def graph(*packages: str) -> dict[str, set[str]]:
    """Which modules each module of `packages` imports, among theirs (read once: do not change it)."""
    known = modules(*packages)
    return {name: imported(path, known) - {name} for name, path in known.items()}


def cycle(edges: dict[str, set[str]]) -> list[str]:
    """One import cycle, or [] (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return []
