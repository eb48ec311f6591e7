"""The code base's layout (docs/architecture.md, "Rules the layout keeps"): small modules, no import
cycle between files, `shared/`'s sub-packages in layers, the wire at the bottom, and a model
version's state machine in one module."""

from __future__ import annotations

import ast

import pytest

from tests.imports import PACKAGES, ROOT, cycle, graph, modules

# file names that several library files may share (issue 42): a traceback names the file, so
# any other name says what its file is on its own
SHARED_NAMES = {
    "__init__.py",
    "service.py",  # each process's wiring: the layout's rules name it (docs/architecture.md)
    "cli.py",  # each command's flags: `shoal`, `shoal perf`, `shoal analyze`
}
# PyTriton's own module paths: a PyTriton script runs once `pytriton.` reads `shoal.pytriton.`
PYTRITON_MIRROR = {
    "shoal/pytriton/exceptions.py",
    "shoal/pytriton/client/exceptions.py",
    "shoal/pytriton/proxy/types.py",
    "shoal/pytriton/model_config/model_config.py",
}

# the one module that makes a model version's states (docs/architecture.md, "The control plane")
STATE_MACHINE = "services.repository.model_states"

MAX_LINES = 450

# shared/'s parts, bottom up: each imports only from the layers below it (docs/architecture.md)
SHARED_LAYERS = (
    {"shared.wire", "shared.errors", "shared.private_internals", "shared.tracing"},
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


def version_states_made(source: str) -> list[int]:
    """The lines where `source` makes a `ModelVersionState` (a version's state: frozen, so making
    one is the only way to change a version's state)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name == "ModelVersionState":
                found.append(node.lineno)
    return found


def repeated_names(paths: list[str]) -> dict[str, list[str]]:
    """File names that more than one of `paths` has, outside SHARED_NAMES and PyTriton's mirror."""
    by_name: dict[str, list[str]] = {}
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        if name not in SHARED_NAMES and path not in PYTRITON_MIRROR:
            by_name.setdefault(name, []).append(path)
    return {name: sorted(found) for name, found in by_name.items() if len(found) > 1}


def test_the_name_finder_finds_a_repeated_name():
    paths = [
        "a/runner.py",
        "b/c/runner.py",
        "a/service.py",
        "b/service.py",
        "shoal/pytriton/proxy/types.py",
        "types.py",
    ]
    assert repeated_names(paths) == {"runner.py": ["a/runner.py", "b/c/runner.py"]}


def test_no_two_library_files_share_a_name():
    paths = [str(path.relative_to(ROOT)) for path in modules(*PACKAGES).values()]
    assert repeated_names(paths) == {}


def test_the_state_finder_finds_a_version_state_made():
    made = (
        "from shared.wire import records\nx = records.ModelVersionState(READY)\ny = ModelVersionState(LOADING, 'r')\n"
    )
    assert version_states_made(made) == [2, 3]
    assert version_states_made("state = ms.LOADING\nstate.state == ModelState.READY\n") == []


def test_only_the_state_machine_makes_a_version_state():
    """Every transition of a model version's state is decided in one module (issue 42)."""
    makers = {
        name: lines
        for name, path in modules(*PACKAGES).items()
        if name != STATE_MACHINE and (lines := version_states_made(path.read_text()))
    }
    assert makers == {}
