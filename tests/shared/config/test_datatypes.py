from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.config import datatypes as dt


@given(st.lists(st.binary(max_size=40), max_size=30))
def test_bytes_round_trip(items):
    array = np.empty(len(items), dtype=object)
    array[:] = items
    wire = dt.serialize_bytes(array)
    assert len(wire) == sum(4 + len(i) for i in items)
    assert list(dt.deserialize_bytes(wire, len(items))) == items


def test_bytes_truncated_is_an_error():
    wire = dt.serialize_bytes(np.array([b"abc"], dtype=object))
    with pytest.raises(ValueError):
        dt.deserialize_bytes(wire[:-1])
    with pytest.raises(ValueError):
        dt.deserialize_bytes(wire, count=2)


@pytest.mark.parametrize("datatype", [d for d in dt.DATATYPES if d != "BYTES"])
def test_fixed_size_round_trip(datatype):
    value = np.arange(6).reshape(2, 3).astype(dt.numpy_dtype(datatype))
    wire = dt.to_bytes(value, datatype)
    assert memoryview(wire).nbytes == 6 * dt.element_size(datatype)
    np.testing.assert_array_equal(dt.from_bytes(wire, datatype, [2, 3]), value)


def test_datatype_names_between_config_numpy_and_protocol():
    assert dt.config_to_protocol("TYPE_STRING") == "BYTES" and dt.config_to_protocol("TYPE_FP32") == "FP32"
    assert dt.protocol_dtype(np.dtype(ml_dtypes.bfloat16)) == "BF16"
    assert dt.protocol_dtype(np.dtype(object)) == "BYTES"
    with pytest.raises(ValueError):
        dt.numpy_dtype("FP8")
