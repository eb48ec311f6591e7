"""Pure logic of the PyTorch and TensorRT backends: name binding, optimization profiles."""

from __future__ import annotations

import pytest

from services.worker.backends.tensorrt_backend import choose_profile
from services.worker.backends.torch_names import (
    FORWARD_ARGUMENT,
    NAMED_INDEX,
    STRICT_CONFIG_ORDERING,
    bind_inputs,
    bind_outputs,
)
from shared.errors import ShoalError


def test_forward_argument_names_bind_by_keyword():
    binding = bind_inputs("m", ["scale", "x"], ["x", "scale"])
    assert binding.convention == FORWARD_ARGUMENT
    assert binding.arguments({"x": 1, "scale": 2}) == ([], {"x": 1, "scale": 2})
    assert binding.arguments({"x": 1}) == ([], {"x": 1})  # an omitted optional input takes forward()'s default


def test_named_index_binds_by_position_whatever_the_prefix():
    binding = bind_inputs("m", ["INPUT__1", "image__0"], ["a", "b"])
    assert binding.convention == NAMED_INDEX and binding.positions == {"image__0": 0, "INPUT__1": 1}
    assert binding.arguments({"INPUT__1": "b", "image__0": "a"}) == (["a", "b"], {})
    assert bind_inputs("m", ["INPUT__0", "INPUT__1"], ["a", "b", "c"]).arguments({"INPUT__0": "a"}) == (["a"], {})
    with pytest.raises(ShoalError, match="position 0 of forward"):
        bind_inputs("m", ["INPUT__0", "INPUT__1"], ["a", "b"]).arguments({"INPUT__1": "b"})
    with pytest.raises(ShoalError, match="index 2 is out of range"):
        bind_inputs("m", ["INPUT__0", "INPUT__2"], ["a", "b"])
    with pytest.raises(ShoalError, match="share an index"):
        bind_inputs("m", ["A__0", "B__0"], ["a", "b"])


def test_other_names_bind_in_config_order():
    binding = bind_inputs("m", ["first", "second"], ["a", "b"])
    assert binding.convention == STRICT_CONFIG_ORDERING and binding.arguments({"second": 2, "first": 1}) == ([1, 2], {})
    with pytest.raises(ShoalError, match="3 inputs but forward\\(\\) takes 2"):
        bind_inputs("m", ["p", "q", "r"], ["a", "b"])


def test_outputs_by_index_or_config_order():
    assert bind_outputs(["OUTPUT__1", "OUTPUT__0"]) == {"OUTPUT__1": 1, "OUTPUT__0": 0}
    assert bind_outputs(["sum", "diff"]) == {"sum": 0, "diff": 1}


def test_tensorrt_profile_choice():
    profiles = [{"x": ((1, 4), (8, 4))}, {"x": ((9, 4), (64, 4))}]
    assert choose_profile({"x": (8, 4)}, profiles) == 0
    assert choose_profile({"x": (9, 4)}, profiles) == 1
    with pytest.raises(
        ShoalError,
        match=r"input 'x' shape \[65, 4\] is outside every optimization profile of the engine "
        r"\(profile 0: min \[1, 4\] max \[8, 4\]; profile 1: min \[9, 4\] max \[64, 4\]\)",
    ):
        choose_profile({"x": (65, 4)}, profiles)
    with pytest.raises(ShoalError, match="outside every optimization profile"):
        choose_profile({"x": (2, 3)}, profiles)
