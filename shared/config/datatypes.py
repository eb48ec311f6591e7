"""Triton datatypes: protocol names, config enum names, numpy dtypes, BYTES encoding."""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np

# protocol name -> numpy dtype (BYTES is an object array of bytes)
_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "BYTES": np.dtype(np.object_),
}
DATATYPES: tuple[str, ...] = tuple(_NUMPY)
_FROM_NUMPY = {dt: name for name, dt in _NUMPY.items() if name != "BYTES"}


def config_to_protocol(config_type: str) -> str:
    """`TYPE_FP32` -> `FP32`; `TYPE_STRING` -> `BYTES`."""
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def numpy_dtype(datatype: str) -> np.dtype:
    try:
        return _NUMPY[datatype]
    except KeyError:
        raise ValueError(f"unknown datatype '{datatype}'") from None


def protocol_dtype(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return "BYTES"
    try:
        return _FROM_NUMPY[dtype]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no Triton datatype") from None


def element_size(datatype: str) -> int:
    """Bytes per element; 0 for BYTES (variable length)."""
    return 0 if datatype == "BYTES" else _NUMPY[datatype].itemsize


def element_count(shape: list[int] | tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def serialize_bytes(array: np.ndarray) -> bytes:
    """BYTES tensor -> Triton's wire form: per element a uint32 LE length then the bytes."""
    parts = []
    for item in array.reshape(-1):
        raw = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(struct.pack("<I", len(raw)))
        parts.append(raw)
    return b"".join(parts)


def deserialize_bytes(buffer: memoryview | bytes, count: int | None = None) -> np.ndarray:
    """Triton's length-prefixed BYTES wire form -> 1-D object array of bytes.

    Raises ValueError when the buffer is truncated or (with `count`) holds a
    different number of elements.
    """
    view = memoryview(buffer).cast("B")
    items: list[bytes] = []
    offset, end = 0, len(view)
    while offset < end:
        if offset + 4 > end:
            raise ValueError("truncated BYTES element length")
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + length > end:
            raise ValueError("BYTES element runs past the end of the tensor data")
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if count is not None and len(items) != count:
        raise ValueError(f"expected {count} BYTES elements, found {len(items)}")
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result


def to_bytes(array: np.ndarray, datatype: str) -> bytes | memoryview:
    """A tensor's raw wire bytes (row-major, little-endian)."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    array = np.ascontiguousarray(array)
    # via uint8: memoryview cannot export extension dtypes such as bfloat16
    return memoryview(array.reshape(-1).view(np.uint8).data) if array.size else b""


def from_bytes(buffer: memoryview | bytes, datatype: str, shape: list[int]) -> np.ndarray:
    """Raw wire bytes -> numpy array (zero-copy for fixed-size types)."""
    if datatype == "BYTES":
        return deserialize_bytes(buffer, element_count(shape)).reshape(shape)
    return np.frombuffer(buffer, dtype=_NUMPY[datatype]).reshape(shape)
