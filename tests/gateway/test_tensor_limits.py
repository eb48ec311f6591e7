"""services/gateway/tensor_limits.py: the int64 limits a front end checks while parsing (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.gateway.tensor_limits import INT64_MAX, check_json_byte_size, check_shape
from shared.errors import ShoalError

shapes = st.lists(st.integers(0, 2**64), max_size=4)


def product(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def overflows(shape: list[int]) -> bool:
    """A dim over int64, or a running count over it (a later 0 does not undo it, as in Triton)."""
    count = 1
    for dim in shape:
        count *= dim
        if dim > INT64_MAX or count > INT64_MAX:
            return True
    return False


@given(shapes)
def test_a_shape_is_refused_exactly_when_its_count_overflows_int64(shape):
    if overflows(shape):
        with pytest.raises(ShoalError, match="causes total element count to exceed maximum size"):
            check_shape("X", shape)
    else:
        check_shape("X", shape)


@given(shapes.filter(lambda s: not overflows(s)), st.sampled_from([1, 2, 4, 8]))
def test_json_data_is_refused_exactly_when_its_bytes_overflow_int64(shape, size):
    if size > 1 and product(shape) * size > INT64_MAX:
        with pytest.raises(ShoalError, match="byte size overflow for input 'X'"):
            check_json_byte_size("X", "FP32", shape, size)
    else:
        check_json_byte_size("X", "FP32", shape, size)
