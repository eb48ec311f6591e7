"""PT2 call-specification names (services/worker/backends/pt2_names.py), as Triton's PyTorch
backend documents them for its `torch_aoti` models."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.worker.backends.pt2_names import (
    Tree,
    bind,
    bind_all_inputs,
    input_interface,
    output_interface,
    paths,
)
from shared.errors import ShoalError

# Triton's README example: forward(hdata, vdata, options: dict, *, kwarg1, kw_arg2)
ARGS: Tree = [None, None, {"keyA": None, "key2": None}]
KWARGS: Tree = {"kwarg1": None, "kw_arg2": None}
RESULT: Tree = {"AAA": None, "ZZZ": None, "BBB": [None, None], "CCC": {"keyA": None, "key2": None}, "DDD": {"KA": None}}


def test_triton_readme_input_names():
    assert input_interface(ARGS, KWARGS).names == [
        "ARGS[0]",
        "ARGS[1]",
        "ARGS[2][keyA]",
        "ARGS[2][key2]",
        "KWARGS[kwarg1]",
        "KWARGS[kw_arg2]",
    ]


def test_triton_readme_output_names_follow_the_dict_order():
    names = output_interface(RESULT).names
    assert names[:4] == ["RESULT[AAA]", "RESULT[ZZZ]", "RESULT[BBB][0]", "RESULT[BBB][1]"]
    assert names[4:] == ["RESULT[CCC][keyA]", "RESULT[CCC][key2]", "RESULT[DDD][KA]"]


def test_a_lone_tensor_result_is_result():
    assert output_interface(None).names == ["RESULT"]
    assert output_interface([None]).names == ["RESULT[0]"]


def test_named_and_ordinal_names_bind_to_the_same_leaf():
    inputs = input_interface(ARGS, KWARGS)
    assert bind("m", "input", ["ARGS[2][key2]", "INPUT__3"][:1], inputs) == {"ARGS[2][key2]": 3}
    assert bind("m", "input", ["INPUT__3"], inputs) == {"INPUT__3": 3}
    with pytest.raises(ShoalError, match="same input"):
        bind("m", "input", ["ARGS[2][key2]", "INPUT__3"], inputs)


@pytest.mark.parametrize("name", ["INPUT__6", "ARGS[3]", "INPUT0", "input__0", "INPUT__x"])
def test_a_name_the_program_lacks_fails_the_load_naming_the_interface(name):
    with pytest.raises(ShoalError) as error:
        bind("m", "input", [name], input_interface(ARGS, KWARGS))
    assert f'io_data does not contain name: "{name}"' in error.value.message
    assert "ARGS[0] (INPUT__0)" in error.value.message


def test_every_input_must_be_given():
    with pytest.raises(ShoalError, match="the config has 2 inputs but the model takes 6; missing: ARGS"):
        bind_all_inputs("m", ["ARGS[0]", "ARGS[1]"], input_interface(ARGS, KWARGS))


trees = st.recursive(
    st.none(),
    lambda children: (
        st.lists(children, min_size=1, max_size=3)
        | st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True), children, min_size=1, max_size=3)
    ),
    max_leaves=12,
)


def _leaves(tree: Tree) -> int:
    if tree is None:
        return 1
    return sum(_leaves(c) for c in (tree.values() if isinstance(tree, dict) else tree))


@given(trees)
def test_one_unique_name_per_leaf_and_ordinals_agree(tree):
    interface = output_interface(tree)
    assert len(interface.names) == _leaves(tree) == len(set(interface.names))
    for index, name in enumerate(interface.names):
        assert interface.position(name) == index == interface.position(f"OUTPUT__{index}")
    assert interface.position(f"OUTPUT__{len(interface.names)}") is None
    if tree is not None:
        assert paths(tree) == [n.removeprefix("RESULT") for n in interface.names]
