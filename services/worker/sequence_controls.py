"""Control tensors of a sequence request (triton-spec §2.2 `control_input`), as pure numpy.

The scheduler sends per request only `SeqControl` (start/end/corrid); the worker turns it
into the tensors the model declared, in the configured datatypes and false/true values.
One row per request: shape [1, 1] for a batching model (concatenated along the batch
dimension with the rest of the batch), [1] for a model with max_batch_size 0. READY is
always true: Shoal batches only ready requests (see `services/scheduler/sequence_batch.py`).
"""

from __future__ import annotations

import numpy as np

from shared.datatypes import numpy_dtype
from shared.messages import SeqControl
from shared.sequence_config import CORRID, END, READY, START, Control, SequenceConfig

FLAG_START, FLAG_END = 1, 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END


def _value(control: Control, seq: SeqControl):
    if control.kind == CORRID:
        return seq.corrid
    flag = {START: seq.start, END: seq.end, READY: True}[control.kind]
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
                raise ValueError(f"sequence id '{value}' is a string but the CORRID control of the model is "
                                 f"{control.datatype}")
            array = np.array([value], dtype=numpy_dtype(control.datatype))
        arrays[control.input_name] = array.reshape(shape)
    return arrays


def flags(seq: SeqControl) -> int:
    """`InferenceRequest.flags()` of Triton's python backend."""
    return (FLAG_START if seq.start else 0) | (FLAG_END if seq.end else 0)
