"""Triton's square backend (`backend: "square"`): IN = [n] answers n responses of OUT = [n].

As the C++ backend: one input IN and one output OUT, both INT32 [1] (the load fails with the
backend's words otherwise); the model is decoupled. Each response waits
`CUSTOM_INFER_DELAY_NS`, then `CUSTOM_OUTPUT_DELAY_NS` after its output is made; once the
client has cancelled, it waits `CUSTOM_CANCEL_DELAY_NS` and stops. The last
`CUSTOM_EMPTY_COUNT` responses are not sent, and the `CUSTOM_FAIL_COUNT` before them carry the
error "simulated failure"; then a final flag with no response ends the stream. A parameter
that is not a number is ignored (and logged), as the C++ backend does.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from services.worker.backends import Backend, Placement
from services.worker.backends.runner import STREAMED, Batch, ModelError, Piece, RequestRunner, Result, Work
from services.worker.backends.stream_threads import StreamThreads
from shared.config.model_config import ModelSpec
from shared.errors import Code, invalid

log = logging.getLogger("shoal.worker")
_PARAMETERS = (
    "CUSTOM_INFER_DELAY_NS",
    "CUSTOM_OUTPUT_DELAY_NS",
    "CUSTOM_CANCEL_DELAY_NS",
    "CUSTOM_FAIL_COUNT",
    "CUSTOM_EMPTY_COUNT",
)


def parameters(spec: ModelSpec) -> dict[str, int]:
    """The backend's parameters; a value that is not a number stays 0 with a log line."""
    values = dict.fromkeys(_PARAMETERS, 0)
    for key in _PARAMETERS:
        if key not in spec.parameters:
            continue
        text = spec.parameters[key]
        if text.isdigit():
            values[key] = int(text)
        else:
            log.info("%s string_value from %s parameter is not a number", text, key)
    return values


def validate(spec: ModelSpec) -> None:
    if len(spec.inputs) != 1:
        raise invalid(f"expected 1 input, got {len(spec.inputs)}")
    if len(spec.outputs) != 1:
        raise invalid(f"expected 1 output, got {len(spec.outputs)}")
    (tensor_in,), (tensor_out,) = spec.inputs, spec.outputs
    if tensor_in.name != "IN":
        raise invalid(f"expected first input tensor name to be IN, got {tensor_in.name}")
    if tensor_out.name != "OUT":
        raise invalid(f"expected first output tensor name to be OUT, got {tensor_out.name}")
    for tensor in (tensor_in, tensor_out):
        if tensor.dims != (1,):
            shape = "[" + ",".join(str(d) for d in tensor.dims) + "]"
            raise invalid(f"expected {tensor.name} shape to be [1], got {shape}")
        if tensor.datatype != "INT32":
            raise invalid(f"expected {tensor.name} datatype to be INT32, got TYPE_{tensor.datatype}")


class SquareInstance(RequestRunner):
    def __init__(self, spec: ModelSpec, path: Path, placement: Placement) -> None:
        validate(spec)
        self.spec = spec
        self.delays = parameters(spec)
        self.threads = StreamThreads(placement.name or spec.name)

    def execute(self, batch: Batch) -> list[Result]:
        batch.inputs_ready()
        return [self._start(work) for work in batch.work]

    def _start(self, work: Work) -> Result:
        values = work.inputs["IN"]
        if values.ndim == 2 and values.shape[0] != 1:
            return ModelError("unexpected shape for IN input", Code.INVALID_ARG)
        count = int(values.reshape(-1)[0])
        if count < 0:
            return ModelError(f"expected IN to be a non-negative count of responses, got {count}", Code.INVALID_ARG)
        stream = work.context.responses
        if stream is None:
            return ModelError(
                "the square backend sends its responses itself: its model must be decoupled "
                "(model_transaction_policy { decoupled: true })",
                Code.INVALID_ARG,
            )
        shape = [1] * values.ndim
        cancelled = work.context.cancelled
        p = self.delays

        def send_all() -> None:
            for index in range(count):
                stopped = cancelled()
                self.threads.sleep((p["CUSTOM_CANCEL_DELAY_NS"] if stopped else p["CUSTOM_INFER_DELAY_NS"]) / 1e9)
                if stopped:
                    break  # Triton's square sends nothing more for a cancelled request but the final flag
                if index + p["CUSTOM_EMPTY_COUNT"] >= count:
                    continue  # the last CUSTOM_EMPTY_COUNT responses are not sent
                output = {"OUT": np.full(shape, count, np.int32)}
                self.threads.sleep(p["CUSTOM_OUTPUT_DELAY_NS"] / 1e9)
                failed = index + p["CUSTOM_FAIL_COUNT"] + p["CUSTOM_EMPTY_COUNT"] >= count
                error = ModelError("simulated failure", Code.UNKNOWN) if failed else None
                stream.send(Piece(outputs=None if failed else output, error=error))
            stream.send(Piece(final=True))

        self.threads.start(stream, send_all)
        return STREAMED

    def close(self) -> None:
        self.threads.close()


BACKEND = Backend("", SquareInstance)
