"""The build `pip install .` made: the modules shoal/compiled_modules.py lists compile all together or not at all,
and `shoal serve` says which it runs (docs/performance.md, "The compiled build")."""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

import pytest

from shoal import compiled_modules


def parsed(path: str) -> ast.Module:
    """A compiled module's source, parsed: the .py beside an installed extension too."""
    spec = importlib.util.find_spec(path.removesuffix(".py").replace("/", "."))
    assert spec is not None and spec.origin is not None
    return ast.parse(Path(spec.origin).with_name(Path(path).name).read_text(), path)


def test_every_listed_module_exists():
    for name in compiled_modules.module_names():
        assert importlib.util.find_spec(name) is not None, name


def test_setup_reads_the_module_list_from_this_module():
    """setup.py loads the list by path (it may not import the project): the path it builds from
    parts must name this module's file, whatever the module is called."""
    root = Path(__file__).resolve().parents[2]
    calls = [
        node
        for node in ast.walk(ast.parse((root / "setup.py").read_text()))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "runpy.run_path"
    ]
    assert len(calls) == 1
    strings = [n for n in ast.walk(calls[0]) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    parts = [n.value for n in sorted(strings, key=lambda n: n.col_offset)]  # in the order written
    # by its module name, not its file: CI's compiled pass imports it from site-packages, not this tree
    assert Path(*parts) == Path(*compiled_modules.__name__.split(".")).with_suffix(".py")


def test_the_build_is_all_compiled_or_all_pure():
    line = compiled_modules.describe()
    assert line.startswith(("build: compiled", "build: pure Python")), line
    compiled = compiled_modules.compiled_modules()
    assert len(compiled) in (0, len(compiled_modules.COMPILED)), compiled


def test_the_build_is_the_one_expected():
    """CI's second pass runs the suite against the compiled wheel with SHOAL_EXPECT_BUILD=compiled."""
    expected = os.environ.get("SHOAL_EXPECT_BUILD")
    if expected is None:
        pytest.skip("SHOAL_EXPECT_BUILD is not set (CI sets it for its compiled pass)")
    assert compiled_modules.describe().startswith(f"build: {expected}"), compiled_modules.describe()


def test_mypy_checks_exactly_the_compiled_modules():
    checked = compiled_modules.mypy_config().split("\n[mypy-")[-1]
    assert checked.endswith("ignore_errors = False\n")
    assert set(checked.split("]")[0].split(",")) == set(compiled_modules.module_names())


def test_no_compiled_function_binds_one_name_to_two_kinds_of_exception():
    """mypyc gives a local one type: `except A as exc` then `except B as exc` in one function makes
    the second raise TypeError compiled (an async function's locals above all). One name per kind."""
    for path in compiled_modules.COMPILED:
        tree = parsed(path)
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            kinds: dict[str, set[str]] = {}
            for node in ast.walk(function):
                if isinstance(node, ast.ExceptHandler) and node.name and node.type is not None:
                    kinds.setdefault(node.name, set()).add(ast.unparse(node.type))
            reused = {name: types for name, types in kinds.items() if len(types) > 1}
            assert not reused, f"{path}:{function.lineno} {function.name}: {reused}"


def test_no_compiled_dataclass_has_a_field_annotated_object():
    """mypyc's dataclasses resolve their fields' annotations by name, and `object` is not among the
    names it knows: importing the compiled module raises KeyError('object'). `Any` says the same."""
    for path in compiled_modules.COMPILED:
        tree = parsed(path)
        for cls in ast.walk(tree):
            if not isinstance(cls, ast.ClassDef) or not any("dataclass" in ast.unparse(d) for d in cls.decorator_list):
                continue
            for field in cls.body:
                if isinstance(field, ast.AnnAssign):
                    assert ast.unparse(field.annotation) != "object", f"{path}:{field.lineno} {cls.name}"


def test_no_compiled_module_defines_what_mypyc_cannot():
    """What mypyc compiles wrong rather than refuses: a class or function defined under an `if`
    (importing the module crashed the interpreter), a module `__getattr__`, and `__getattr__` in a
    class (native classes never call it)."""
    for path in compiled_modules.COMPILED:
        tree = parsed(path)
        definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        for node in tree.body:
            if isinstance(node, ast.If | ast.Try):
                nested = [d for d in ast.walk(node) if isinstance(d, definitions)]
                assert not nested, f"{path}:{node.lineno}: {[d.name for d in nested]} defined conditionally"
            if isinstance(node, ast.FunctionDef):
                assert node.name != "__getattr__", f"{path}:{node.lineno}: a module __getattr__"
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef):
                names = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
                assert "__getattr__" not in names, f"{path}:{cls.lineno} {cls.name}: __getattr__"


# GCC's keywords that mypyc's C name of an attribute (`_` + its name) can make: `self._thread` became
# `PyObject *__thread;` in the generated struct, which gcc refuses (the build fell back to pure Python)
C_KEYWORDS = {"__thread", "__inline", "__restrict", "__const", "__volatile", "__asm", "__signed", "__typeof"}
C_KEYWORDS |= {"__alignof", "__real", "__imag", "__attribute", "__label__", "__int128", "__auto_type", "__extension__"}


def test_no_compiled_attribute_is_named_like_a_c_keyword():
    for path in compiled_modules.COMPILED:
        tree = parsed(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                assert f"_{node.attr}" not in C_KEYWORDS, f"{path}:{node.lineno}: self.{node.attr}"


def test_no_compiled_module_runs_code_that_mypy_calls_unreachable():
    """mypy reads `if TYPE_CHECKING:` as always true, so mypyc compiles its `else:` into "Reached
    allegedly unreachable code!" (RuntimeError at import): the gateway's gRPC conversions once bound
    Triton's protobuf modules there. A typing-only `if TYPE_CHECKING:` without `else` is fine."""
    for path in compiled_modules.COMPILED:
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                assert not node.orelse, f"{path}:{node.lineno}: code under `else` of `if TYPE_CHECKING`"
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("not TYPE_CHECKING", "not typing.TYPE_CHECKING"):
                raise AssertionError(f"{path}:{node.lineno}: code under `if not TYPE_CHECKING`")
