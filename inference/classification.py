"""Triton's classification extension: an output replaced by its top classes, for any transport."""

from __future__ import annotations

import numpy as np

from inference.types import OutputTensor
from shared.config.datatypes import numpy_dtype, serialize_bytes
from shared.errors import invalid

_CLASSIFIABLE = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "FP32", "FP64")


def classify(out: OutputTensor, count: int, batching: bool, labels: list[str] | None = None) -> OutputTensor:
    """Triton's classification extension: top-`count` "value:index[:label]" strings per batch row."""
    if out.datatype not in _CLASSIFIABLE:
        raise invalid(f"class result not available for output '{out.name}' due to unsupported type '{out.datatype}'")
    if out.data is None:  # an output in the client's shared memory cannot be classified (refused when parsed)
        raise invalid(f"Output can't set both 'shared_memory_region' and 'classification' for output '{out.name}'")
    values = np.frombuffer(out.data, dtype=numpy_dtype(out.datatype)).reshape(out.shape)
    rows = values.reshape(values.shape[0], -1) if batching and values.ndim else values.reshape(1, -1)
    k = min(count, rows.shape[1])
    result = []
    for row in rows:
        for index in np.argsort(-row.astype(np.float64), kind="stable")[:k]:
            value = row[index]
            text = f"{value:.6f}" if out.datatype.startswith("FP") else str(int(value))
            label = f":{labels[index]}" if labels and index < len(labels) and labels[index] else ""
            result.append(f"{text}:{index}{label}".encode())
    array = np.empty(len(result), dtype=object)
    array[:] = result
    shape = [rows.shape[0], k] if batching else [k]
    return OutputTensor(out.name, "BYTES", shape, serialize_bytes(array), out.binary)
