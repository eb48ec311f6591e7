"""The JSON `data` decoder against the implementation it replaced (the oracle, copied below as it
was): for any data, valid or not, the same bytes or the same error (class, status and text)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.gateway.http.json_data import json_tensor_bytes
from shared.config.datatypes import DATATYPES, element_count, numpy_dtype, serialize_bytes
from shared.errors import ShoalError, internal, invalid

# -- the oracle: services/gateway/http/codec.py's json_tensor_bytes before the fast path ----------------


def _json_error(what: str, detail: str) -> ShoalError:
    return internal(f"Unable to parse '{what}': {detail}")


def _flatten(data: Any, out: list) -> None:
    if isinstance(data, list):
        for item in data:
            _flatten(item, out)
    else:
        out.append(data)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def reference_json_tensor_bytes(name: str, datatype: str, shape: list[int], data: Any) -> bytes:
    if datatype in ("FP16", "BF16"):
        raise invalid(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data format for input {name}"
        )
    if not isinstance(data, list):
        raise _json_error("data", "attempt to access JSON non-array as array")
    flat: list = []
    _flatten(data, flat)
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise internal("Unable to parse JSON bytes array: attempt to access JSON non-string as string")
    elif datatype == "BOOL":
        if not all(isinstance(v, bool) for v in flat):
            raise _json_error("data", "attempt to access JSON non-boolean as boolean")
    elif datatype.startswith("UINT"):
        if not all(_is_int(v) and 0 <= v < 2**64 for v in flat):
            raise _json_error("data", "attempt to access JSON non-unsigned-integer as unsigned-integer")
    elif datatype.startswith("INT"):
        if not all(_is_int(v) and -(2**63) <= v < 2**63 for v in flat):
            raise _json_error("data", "attempt to access JSON non-signed-integer as signed-integer")
    elif not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
        raise _json_error("data", "attempt to access JSON non-number as double")
    expected = element_count(shape)
    if len(flat) < expected:
        raise invalid("Failed to parse 'data' field: shape does not match true shape")
    if len(flat) > expected:
        raise invalid("Unable to parse 'data': Shape does not match true shape of 'data' field")
    if datatype == "BYTES":
        array = np.empty(len(flat), dtype=object)
        array[:] = [v.encode("utf-8", errors="surrogateescape") for v in flat]
        return serialize_bytes(array)
    wide = np.uint64 if datatype.startswith("UINT") else np.int64 if datatype.startswith("INT") else None
    if wide is not None:
        return np.array(flat, dtype=wide).astype(numpy_dtype(datatype)).tobytes()
    return np.array(flat, dtype=np.float64 if datatype != "BOOL" else np.bool_).astype(numpy_dtype(datatype)).tobytes()


# -- data: every JSON kind, the edges of each datatype, nested regularly or not --------------------------

EDGE_INTS = [0, 1, -1, 255, 256, -129, 2**31, -(2**31) - 1, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1]
EDGE_INTS += [2**64 - 1, 2**64, 10**30, -(10**30), 10**400]
EDGE_FLOATS = [0.0, -0.0, 0.5, 1e300, -1e300, 3.4e38, 1e-320, float("nan"), float("inf"), float("-inf")]

ints = st.integers(-1000, 1000) | st.sampled_from(EDGE_INTS) | st.integers()
floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(EDGE_FLOATS)
strings = st.text(max_size=6) | st.sampled_from(["", "é", "\udc80\udcff", "\ud800", "a\x00b"])
scalars = st.none() | st.booleans() | ints | floats | strings
oddities = st.dictionaries(st.text(max_size=2), scalars, max_size=2) | st.tuples(ints)

LEAVES_OF_KIND = {"BOOL": st.booleans(), "BYTES": strings, "FP": ints | floats, "UINT": ints, "INT": ints}


def leaves_for(datatype: str) -> st.SearchStrategy:
    kind = next((k for k in ("BOOL", "BYTES", "FP", "UINT", "INT") if datatype.startswith(k)), "FP")
    return LEAVES_OF_KIND[kind]


@st.composite
def regular(draw: st.DrawFn, leaves: st.SearchStrategy) -> Any:
    """A nested list of one shape (what clients send), with occasionally one odd element."""

    def build(dims: list[int]) -> list:
        if len(dims) == 1:
            return draw(st.lists(leaves, min_size=dims[0], max_size=dims[0]))
        return [build(dims[1:]) for _ in range(dims[0])]

    array = build(draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)))
    if draw(st.integers(0, 3)) == 0:  # somewhere down one branch, an element of another kind or depth
        at = array
        while at and isinstance(at[0], list) and draw(st.booleans()):
            at = at[draw(st.integers(0, len(at) - 1))]
        if at:
            at[draw(st.integers(0, len(at) - 1))] = draw(scalars | oddities | st.lists(leaves, max_size=2))
    return array


def arbitrary(leaves: st.SearchStrategy) -> st.SearchStrategy:
    """Ragged, mixed, deep: anything lists of these can be, and a few things that are not lists."""
    mixed = leaves | scalars | oddities
    return st.recursive(mixed, lambda inner: st.lists(inner, max_size=4), max_leaves=24) | st.lists(mixed)


@st.composite
def case(draw: st.DrawFn) -> tuple[str, list[int], Any]:
    datatype = draw(st.sampled_from(DATATYPES))
    leaves = leaves_for(datatype)
    data = draw(regular(leaves) | arbitrary(leaves))
    flat: list = []
    _flatten(data, flat)
    count = len(flat)
    shape = draw(st.sampled_from([[count], [1, count], [count, 1]]) | st.lists(st.integers(0, 5), max_size=3))
    return datatype, shape, data


def outcome(decode: Any, datatype: str, shape: list[int], data: Any) -> tuple:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a double beyond FP32's range: both cast to inf
        try:
            return ("bytes", decode("IN", datatype, shape, data))
        except ShoalError as exc:
            return ("shoal", exc.http_status, exc.message)
        except Exception as exc:  # not Triton's texts, but they must not change either
            return (type(exc).__name__, str(exc))


@settings(max_examples=800)
@given(case())
def test_same_bytes_or_same_error_as_the_oracle(example: tuple[str, list[int], Any]) -> None:
    datatype, shape, data = example
    assert outcome(json_tensor_bytes, datatype, shape, data) == outcome(
        reference_json_tensor_bytes, datatype, shape, data
    )


@pytest.mark.parametrize(
    "datatype, shape, data",
    [
        ("INT32", [2], [True, 1]),  # numpy reads True as 1: the oracle refuses it
        ("FP32", [2], [1, False]),
        ("INT64", [2], [1, 2**63]),
        ("UINT64", [2], [-1, 2**64 - 1]),
        ("UINT8", [2], [1.0, 2]),
        ("INT32", [3], [[1, 2], [3]]),  # ragged: allowed, as Triton reads values in order
        ("INT32", [3], [[1, 2], 3]),  # lists and values at one level
        ("INT32", [2], [[1], [[2]]]),  # different depths
        ("FP32", [0], [[], []]),
        ("BYTES", [2], [["ab"], "cd"]),  # a string is no list to flatten
        ("BYTES", [1], ["\ud800"]),
        ("FP32", [1], [10**400]),
        ("FP32", [2], [float("nan"), float("inf")]),
        ("BOOL", [1], [{"a": 1}]),
        ("INT8", [3], [300, -129, 2**63 - 1]),
    ],
)
def test_corners_as_the_oracle(datatype: str, shape: list[int], data: Any) -> None:
    assert outcome(json_tensor_bytes, datatype, shape, data) == outcome(
        reference_json_tensor_bytes, datatype, shape, data
    )


def test_valid_nested_values_are_read_as_triton_reads_them() -> None:
    assert json_tensor_bytes("I", "INT8", [2, 2], [[300, -1], [127, -129]]) == bytes([44, 255, 127, 127])
    assert json_tensor_bytes("U", "UINT16", [2], [2**64 - 1, 65536]) == b"\xff\xff\x00\x00"
    assert json_tensor_bytes("F", "FP32", [1, 2], [[1, 0.1]]) == np.array([1, 0.1], np.float32).tobytes()
    assert json_tensor_bytes("S", "BYTES", [2], ["ab", "\udcff"]) == b"\x02\x00\x00\x00ab\x01\x00\x00\x00\xff"
