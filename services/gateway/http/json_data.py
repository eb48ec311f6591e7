"""A JSON input's `data` array (KServe v2 JSON, flat or nested, row-major) -> the tensor's wire bytes.

Two paths with one answer. The fast one takes the common, valid request: its values are flattened
and their exact types counted by C loops (`itertools.chain`, `map(type, ...)`, `list.count`), then
numpy converts them once (`np.fromiter`). It answers only when it is certain; anything else (a wrong element type, bools among
numbers, mixed nesting depths, an integer beyond 64 bits, a wrong element count) goes to the
checked path, which looks at every element and owns every error text (Triton's, docs/triton-spec.md
§1.2). Why and what it saves: docs/performance.md, "JSON input values".
"""

from __future__ import annotations

import struct
from itertools import chain, repeat
from operator import countOf
from typing import Any

import numpy as np

from shared.config.datatypes import element_count, numpy_dtype, serialize_bytes
from shared.errors import ShoalError, internal, invalid

_SIGNED = ("INT8", "INT16", "INT32", "INT64")
_UNSIGNED = ("UINT8", "UINT16", "UINT32", "UINT64")

# The exact element types the fast path accepts per datatype, the most common first (bool is a
# subclass of int: not among them). Counted by identity, which is why exact types and not isinstance.
_LEAF_TYPES: dict[str, tuple[type, ...]] = {
    "BOOL": (bool,),
    "BYTES": (str,),
    "FP32": (float, int),
    "FP64": (float, int),
    **{datatype: (int,) for datatype in _SIGNED + _UNSIGNED},
}

# As Triton, integers are read as 64-bit and narrowed (wrapping), floats read as doubles.
_READ_AS: dict[str, type] = {"BOOL": np.bool_, "FP32": np.float64, "FP64": np.float64}
_READ_AS |= {datatype: np.int64 for datatype in _SIGNED} | {datatype: np.uint64 for datatype in _UNSIGNED}

_LENGTH = struct.Struct("<I")


def json_tensor_bytes(name: str, datatype: str, shape: list[int], data: Any) -> bytes:
    """`data` -> wire bytes, checked against `shape` and `datatype`.

    Texts as Triton's ReadDataFromJson: a wrong element count is a 400; an element of the
    wrong JSON kind is its JSON helper's INTERNAL error (500, Shoal's documented choice)."""
    if datatype in ("FP16", "BF16"):
        raise invalid(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data format for input {name}"
        )
    if not isinstance(data, list):
        raise _data_error("attempt to access JSON non-array as array")
    fast = _fast_bytes(datatype, element_count(shape), data)
    return fast if fast is not None else _checked_bytes(datatype, shape, data)


def _fast_bytes(datatype: str, count: int, data: list[Any]) -> bytes | None:
    """The bytes of a valid `data`, or None where this path is not certain it is valid."""
    kinds = _LEAF_TYPES.get(datatype)
    values = _leaves(data)
    if kinds is None or values is None or len(values) != count or not _all_of(values, kinds):
        return None
    if datatype in _UNSIGNED and values and min(values) < 0:
        return None  # numpy 1.x wraps a negative into uint64 (2.x raises): the checked path refuses it
    try:
        if datatype == "BYTES":
            return _bytes_elements(values)
        if datatype == "BOOL":
            return bytes(values)  # True and False are the ints 1 and 0: Triton's one byte per element
        wide: np.ndarray = np.fromiter(values, dtype=_READ_AS[datatype], count=count)
    except (OverflowError, UnicodeEncodeError):  # beyond INT64/UINT64 or a double; an unencodable string
        return None
    return wide.astype(numpy_dtype(datatype)).tobytes()


def _leaves(data: list[Any]) -> list[Any] | None:
    """The values of a nested list in row-major order, flattened level by level; None where one
    level mixes lists and values (the checked path's flattening, which allows it, decides)."""
    level = data
    while level and type(level[0]) is list:
        if countOf(map(type, level), list) != len(level):
            return None
        # one row (a batch of 1, the common request) needs no copy
        level = level[0] if len(level) == 1 else list(chain.from_iterable(level))
    return level


def _all_of(values: list[Any], kinds: tuple[type, ...]) -> bool:
    """Whether every value's type is one of `kinds` (a value that is a list is not)."""
    types = list(map(type, values))
    seen = 0
    for kind in kinds:
        seen += types.count(kind)  # identity first: cheap where the type matches, as in valid data
        if seen == len(types):
            return True
    return not types


def _bytes_elements(values: list[str]) -> bytes:
    """Triton's BYTES wire form (a uint32 length, then the bytes, per element), as serialize_bytes
    writes it; strings' undecodable bytes (surrogate escapes from the parser) written back as they were."""
    encoded = list(map(str.encode, values, repeat("utf-8"), repeat("surrogateescape")))
    return b"".join(chain.from_iterable(zip(map(_LENGTH.pack, map(len, encoded)), encoded)))


def _data_error(detail: str) -> ShoalError:
    # Triton tags every JSON parse/type error INTERNAL (500); kept for compatibility.
    return internal(f"Unable to parse 'data': {detail}")


# -- the checked path: every element looked at, every error Triton's ----------------------------------


def _checked_bytes(datatype: str, shape: list[int], data: list[Any]) -> bytes:
    flat: list[Any] = []
    _flatten(data, flat)
    _check_kinds(datatype, flat)
    expected = element_count(shape)
    if len(flat) < expected:  # Triton's check after reading (ReadDataFromJson)
        raise invalid("Failed to parse 'data' field: shape does not match true shape")
    if len(flat) > expected:  # Triton's check while reading, one element past the shape
        raise invalid("Unable to parse 'data': Shape does not match true shape of 'data' field")
    if datatype == "BYTES":
        array = np.empty(len(flat), dtype=object)
        array[:] = [v.encode("utf-8", errors="surrogateescape") for v in flat]
        return serialize_bytes(array)
    return np.array(flat, dtype=_READ_AS.get(datatype, np.float64)).astype(numpy_dtype(datatype)).tobytes()


def _check_kinds(datatype: str, flat: list[Any]) -> None:
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise internal("Unable to parse JSON bytes array: attempt to access JSON non-string as string")
    elif datatype == "BOOL":
        if not all(isinstance(v, bool) for v in flat):
            raise _data_error("attempt to access JSON non-boolean as boolean")
    elif datatype in _UNSIGNED:
        if not all(_is_int(v) and 0 <= v < 2**64 for v in flat):
            raise _data_error("attempt to access JSON non-unsigned-integer as unsigned-integer")
    elif datatype in _SIGNED:
        if not all(_is_int(v) and -(2**63) <= v < 2**63 for v in flat):
            raise _data_error("attempt to access JSON non-signed-integer as signed-integer")
    elif not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
        raise _data_error("attempt to access JSON non-number as double")


def _flatten(data: Any, out: list[Any]) -> None:
    if isinstance(data, list):
        for item in data:
            _flatten(item, out)
    else:
        out.append(data)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
