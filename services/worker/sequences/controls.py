"""Control tensors of a sequence request (docs/triton-spec.md §2.2 `control_input`), as pure numpy.

The scheduler sends per request only `SeqControl` (start/end/corrid); the worker turns it
into the tensors the model declared, in the configured datatypes and false/true values.
One row per request: shape [1, 1] for a batching model (concatenated along the batch
dimension with the rest of the batch), [1] for a model with max_batch_size 0.

`direct` keeps Triton's promise that a sequence owns a batch row (the strategy exists for
models that keep state per batch slot): `pad_slots` puts each request in the row of its
slot and fills empty slots below the highest one with not-ready rows (READY false, zero
inputs), whose outputs are dropped. Python models get only their real requests (they key
state on `correlation_id()`; a null request would break Triton-style models).
"""

from __future__ import annotations

import numpy as np

from shared.config.datatypes import numpy_dtype
from shared.config.sequence_config import CORRID, END, READY, START, Control, SequenceConfig
from shared.wire.messages import SeqControl

FLAG_START, FLAG_END = 1, 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END


def _value(control: Control, seq: SeqControl):
    if control.kind == CORRID:
        return seq.corrid
    flag = {START: seq.start, END: seq.end, READY: seq.ready}[control.kind]
    return control.false_true[1] if flag else control.false_true[0]


def control_arrays(config: SequenceConfig, seq: SeqControl) -> dict[str, np.ndarray]:
    shape = (1, 1) if config.max_batch_size > 0 else (1,)
    arrays = {}
    for control in config.controls:
        value = _value(control, seq)
        if control.datatype == "BYTES":
            array = np.array([str(value).encode()], dtype=object)
        else:
            if control.kind == CORRID and isinstance(value, str):
                raise ValueError(
                    f"sequence id '{value}' is a string but the CORRID control of the model is {control.datatype}"
                )
            array = np.array([value], dtype=numpy_dtype(control.datatype))
        arrays[control.input_name] = array.reshape(shape)
    return arrays


def flags(seq: SeqControl) -> int:
    """`InferenceRequest.flags()` of Triton's python backend."""
    return (FLAG_START if seq.start else 0) | (FLAG_END if seq.end else 0)


def _blank(array: np.ndarray) -> np.ndarray:
    if array.dtype == object:
        return np.full(array.shape, b"", dtype=object)
    return np.zeros_like(array)


def pad_slots(
    config: SequenceConfig,
    controls: list[SeqControl],
    rows: list[dict[str, np.ndarray]],
    initial_state: dict[str, np.ndarray],
) -> tuple[list[dict[str, np.ndarray]], list[int]]:
    """Rows in slot order with not-ready rows for the gaps; and where each request's row is."""
    slots = [c.slot for c in controls]
    if len(set(slots)) != len(slots):  # cannot happen (one request per sequence per batch): do not pad
        return rows, list(range(len(rows)))
    corrid_control = config.control(CORRID)
    null = SeqControl(
        corrid="" if corrid_control is not None and corrid_control.datatype == "BYTES" else 0, seq=0, ready=False
    )
    blank = {name: _blank(array) for name, array in rows[0].items()}
    blank.update(control_arrays(config, null))
    blank.update(initial_state)
    padded = [blank] * (max(slots) + 1)
    for slot, row in zip(slots, rows):
        padded[slot] = row
    return padded, slots
