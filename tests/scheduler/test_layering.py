"""The scheduler's layout (docs/architecture.md, "Rules the layout keeps"): its sub-packages and
top-level modules import each other without a cycle, and the shared records are a leaf. Read
from the source's import statements (those under `if TYPE_CHECKING:` too), so it stays true."""

from __future__ import annotations

import ast
from pathlib import Path

import services.scheduler
from tests.imports import cycle

ROOT = Path(services.scheduler.__file__).parent
PREFIX = "services.scheduler."


def part(module: str) -> str:
    """The sub-package (`batching`) or top-level module (`scheduling_records`) a module belongs to."""
    return module.removeprefix(PREFIX).split(".")[0]


def imports(path: Path) -> set[str]:
    """The scheduler's modules that a file imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(PREFIX))
    return found


def graph() -> dict[str, set[str]]:
    """Which parts each part imports (imports within one part are its own business)."""
    edges: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        module = PREFIX + ".".join(path.relative_to(ROOT).with_suffix("").parts)
        here = part(module)
        edges.setdefault(here, set()).update(part(m) for m in imports(path) if part(m) != here)
    return edges


def test_no_import_cycle_between_the_schedulers_parts():
    edges = graph()
    assert {"batching", "sequences", "replicas", "ensembles", "statistics", "scheduling_records"} <= set(edges)
    assert cycle(edges) == []


def test_batching_and_the_sequence_batcher_meet_only_through_the_discipline_interface():
    edges = graph()
    assert "sequences" not in edges["batching"]  # the sequence batcher uses batching, never the reverse


def test_the_records_are_a_leaf():
    assert imports(ROOT / "scheduling_records.py") == set()
