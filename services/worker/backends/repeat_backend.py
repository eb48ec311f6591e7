"""Triton's repeat backend (`backend: "repeat"`): zero, one or many responses per request.

As the C++ backend: the config has `max_batch_size: 0`, inputs IN (INT32 [n]), DELAY (UINT32
[n]) and WAIT (UINT32 [1]), outputs OUT (INT32 [1]) and IDX (UINT32 [1]) (the load fails with
the backend's words otherwise). For each element e of IN it waits DELAY[e] ms, then sends a
response with OUT = [IN[e]] and IDX = [e]; after the last one a final flag with no response.
`execute` itself holds the instance for WAIT ms before it takes the next request, while the
responses go on from a thread of their own. The model is meant to be decoupled
(`model_transaction_policy { decoupled: true }`); without it, IN must have exactly one element.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from services.worker.backends import Backend, Placement
from services.worker.backends.runner import STREAMED, Batch, ModelError, Piece, RequestRunner, Result, Work
from services.worker.backends.stream_threads import StreamThreads
from shared.config.model_config import ModelSpec, TensorSpec
from shared.errors import Code, invalid

_INPUTS = (("IN", "INT32"), ("DELAY", "UINT32"), ("WAIT", "UINT32"))
_OUTPUTS = (("OUT", "INT32"), ("IDX", "UINT32"))
_ORDINALS = ("first", "second", "third")


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _check_names(tensors: tuple[TensorSpec, ...], wanted: tuple[tuple[str, str], ...], what: str) -> None:
    for ordinal, tensor, (name, _) in zip(_ORDINALS, tensors, wanted):
        if tensor.name != name:
            raise invalid(f"expected {ordinal} {what} tensor name to be {name}, got {tensor.name}")
    for tensor, (name, datatype) in zip(tensors, wanted):
        if tensor.datatype != datatype:
            raise invalid(f"expected {name} datatype to be {datatype}, got TYPE_{tensor.datatype}")


def validate(spec: ModelSpec) -> None:
    """The repeat backend's checks of its config, with its texts."""
    if spec.max_batch_size != 0:
        raise invalid("repeat backend only supports models with max_batch_size == 0")
    if len(spec.inputs) != 3:
        raise invalid(f"expected 3 inputs, got {len(spec.inputs)}")
    if len(spec.outputs) != 2:
        raise invalid(f"expected 2 outputs, got {len(spec.outputs)}")
    _check_names(spec.inputs, _INPUTS, "input")
    _check_names(spec.outputs, _OUTPUTS, "output")
    tensor_in, delay, wait = spec.inputs
    if len(tensor_in.dims) != 1:
        raise invalid(f"expected IN shape to have one dimension, got {_shape(tensor_in.dims)}")
    if tensor_in.dims != delay.dims:
        raise invalid(f"expected IN and DELAY shape to match, got {_shape(tensor_in.dims)} and {_shape(delay.dims)}")
    for tensor in (wait, *spec.outputs):
        if tensor.dims != (1,):
            raise invalid(f"expected {tensor.name} shape to be [1], got {_shape(tensor.dims)}")


class RepeatInstance(RequestRunner):
    def __init__(self, spec: ModelSpec, path: Path, placement: Placement) -> None:
        validate(spec)
        self.spec = spec
        self.threads = StreamThreads(placement.name or spec.name)

    def execute(self, batch: Batch) -> list[Result]:
        batch.inputs_ready()
        if len(batch.work) > 1:
            error = ModelError("repeat backend does not support batched request execution", Code.INVALID_ARG)
            return [error] * len(batch.work)
        work = batch.work[0]
        wait = work.inputs["WAIT"].reshape(-1)
        if wait.size != 1:
            return [ModelError("unexpected size for WAIT input", Code.INVALID_ARG)]
        values, delays = work.inputs["IN"], work.inputs["DELAY"]
        if values.shape != delays.shape:
            return [
                ModelError(
                    f"expected IN and DELAY shape to match, got {_shape(values.shape)} and {_shape(delays.shape)}",
                    Code.INVALID_ARG,
                )
            ]
        result = self._respond(work, values.reshape(-1), delays.reshape(-1))
        self.threads.sleep(int(wait[0]) / 1000)  # the instance is held, as the C++ backend's execute is
        return [result]

    def _respond(self, work: Work, values: np.ndarray, delays: np.ndarray) -> Result:
        stream = work.context.responses
        if stream is None:  # not decoupled: one response is all a client can get
            if values.size != 1:
                return ModelError(
                    f"the repeat backend sends one response per element of IN ({values.size} here): "
                    "its model must be decoupled (model_transaction_policy { decoupled: true })",
                    Code.INVALID_ARG,
                )
            self.threads.sleep(int(delays[0]) / 1000)
            return {"OUT": values[:1].astype(np.int32), "IDX": np.zeros(1, np.uint32)}

        def send_all() -> None:
            for index, (value, delay) in enumerate(zip(values.tolist(), delays.tolist())):
                self.threads.sleep(delay / 1000)
                stream.send(Piece(outputs={"OUT": np.array([value], np.int32), "IDX": np.array([index], np.uint32)}))
            stream.send(Piece(final=True))

        self.threads.start(stream, send_all)
        return STREAMED

    def close(self) -> None:
        self.threads.close()


BACKEND = Backend("", RepeatInstance)
