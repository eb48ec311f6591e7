"""The code base's layout (docs/architecture.md, "Rules the layout keeps"): small modules, no import
cycle between files, and `shared/`'s sub-packages in layers, the wire at the bottom."""

from __future__ import annotations

import pytest

from tests.imports import PACKAGES, ROOT, cycle, graph, modules

MAX_LINES = 450

# shared/'s parts, bottom up: each imports only from the layers below it (docs/architecture.md)
SHARED_LAYERS = (
    {"shared.wire", "shared.errors", "shared.fences", "shared.tracing"},
    {"shared.config", "shared.memory"},
    {"shared.bus", "shared.process"},
)


def part(module: str) -> str:
    """`shared.bus.hot_path` -> `shared.bus`; `shared.errors` -> itself."""
    return ".".join(module.split(".")[:2])


def test_the_cycle_finder_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_450_lines(package):
    long = {
        str(path.relative_to(ROOT)): lines
        for path in modules(package).values()
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_import_cycle_between_files():
    assert cycle(graph(*PACKAGES)) == []


def test_the_wire_imports_nothing_of_shoals():
    """msgspec and typing only: every process can decode every message."""
    edges = graph(*PACKAGES)
    outside = {
        m: sorted(t for t in edges[m] if not t.startswith("shared.wire")) for m in edges if m.startswith("shared.wire")
    }
    assert {m: targets for m, targets in outside.items() if targets} == {}


def test_shared_imports_nothing_above_it():
    up = {
        m: sorted(t for t in targets if not t.startswith("shared"))
        for m, targets in graph(*PACKAGES).items()
        if m.startswith("shared")
    }
    assert {m: t for m, t in up.items() if t} == {}


def test_shareds_parts_import_only_the_layers_below_them():
    layer = {name: i for i, names in enumerate(SHARED_LAYERS) for name in names}
    edges = graph("shared")
    assert {part(m) for m in edges} - {"shared"} <= set(layer)  # every part is placed in a layer
    wrong = {
        f"{m} -> {t}"
        for m, targets in edges.items()
        for t in targets
        if part(m) in layer and part(t) != part(m) and layer[part(t)] >= layer[part(m)]
    }
    assert wrong == set()
