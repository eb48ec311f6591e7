"""Triton's identity backend (`backend: "identity"`): each OUTPUT<i> is a copy of INPUT<i>.

What Triton's QA, tutorials and perf_analyzer examples rely on, as the C++ backend does it:
the config must pair every `INPUT<i>` with an `OUTPUT<i>` of the same datatype and shape
(the load fails with the backend's words otherwise); each request's outputs take the shape
its inputs came with; a requested output whose optional input the request left out is zeros
in the input's config shape (-1 read as 1, the request's batch first); the `parameters`
`execute_delay_ms` (times the instance's index with `instance_wise_delay_multiplier`) and
`creation_delay_sec` slow it down on purpose; `input_byte_size_counter{model,version}` counts
the input bytes it was sent, on `/metrics` as Triton's identity backend reports it; every
response carries its example parameters (`param0` "an example string parameter", `param1` 42,
`param2` false, `param3` 123.123); with --log-verbose it logs each request and input as its
verbose lines do (`\tinput INPUT0: datatype = FP32, shape = [1,5], byte_size = 20, ...`), which
qa/L0_backend_identity counts. No model file: the version directory is all it needs.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from services.worker.backends import Backend, Placement
from services.worker.backends.backend_metrics import counter
from services.worker.backends.parameters import integer
from services.worker.backends.runner import Answer, Batch, ModelError, RequestRunner, Result, Work
from shared.config.datatypes import numpy_dtype, protocol_dtype, serialize_bytes
from shared.config.model_config import ModelSpec, TensorSpec
from shared.errors import Code, invalid

log = logging.getLogger("shoal.worker.identity")
# identity.cc's TRITONBACKEND_ResponseSet*Parameter calls, on every response
PARAMETERS: dict[str, object] = {
    "param0": "an example string parameter",
    "param1": 42,
    "param2": False,
    "param3": 123.123,
}


def _index(name: str, prefix: str, what: str) -> str:
    if not name.startswith(prefix):
        raise invalid(f"expected {what} name to follow {prefix}<index> pattern, got '{name}'")
    return name[len(prefix) :]


def _shape(tensor: TensorSpec) -> tuple[int, ...]:
    return tensor.reshape if tensor.reshape is not None else tensor.dims


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def validate(spec: ModelSpec) -> dict[str, TensorSpec]:
    """Triton's checks of an identity config; the inputs by their index."""
    if len(spec.inputs) != len(spec.outputs):
        raise invalid("model configuration must have equal input/output pairs")
    inputs: dict[str, TensorSpec] = {}
    outputs: dict[str, TensorSpec] = {}
    for tensor_in, tensor_out in zip(spec.inputs, spec.outputs):
        inputs[_index(tensor_in.name, "INPUT", "input")] = tensor_in
        outputs[_index(tensor_out.name, "OUTPUT", "output")] = tensor_out
    for index, tensor_out in outputs.items():
        if index not in inputs:
            raise invalid("expected input and output indices to match")
        tensor_in = inputs[index]
        if tensor_in.datatype != tensor_out.datatype:
            raise invalid(
                f"expected input and output datatype to match, got TYPE_{tensor_in.datatype} and TYPE_{tensor_out.datatype}"
            )
        if _shape(tensor_in) != _shape(tensor_out):
            raise invalid(
                "expected input and output shape to match, got "
                f"{_shape_text(_shape(tensor_in))} and {_shape_text(_shape(tensor_out))}"
            )
    return inputs


class IdentityInstance(RequestRunner):
    def __init__(self, spec: ModelSpec, path: Path, placement: Placement) -> None:
        self.spec = spec
        self.inputs = validate(spec)
        delay_s = integer(spec, "creation_delay_sec")
        if delay_s > 0:
            time.sleep(delay_s)
        multiplier = integer(spec, "instance_wise_delay_multiplier")
        delay_ms = integer(spec, "execute_delay_ms")
        self.delay_s = delay_ms * max(multiplier * placement.index if multiplier > 0 else 1, 1) / 1000
        self.input_bytes = counter(
            "input_byte_size_counter",
            "Cumulative input byte size of all requests received by the model",
            {"model": spec.name, "version": str(placement.version)},
        )

    def execute(self, batch: Batch) -> list[Result]:
        batch.inputs_ready()
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        verbose = log.isEnabledFor(logging.DEBUG)
        return [self._one(r, work, verbose) for r, work in enumerate(batch.work)]

    def _one(self, r: int, work: Work, verbose: bool) -> Result:
        outputs: dict[str, np.ndarray] = {}
        batched = self.spec.max_batch_size > 0
        lead = [next(iter(work.inputs.values())).shape[0]] if batched and work.inputs else []
        if verbose:
            log.debug(
                'request %d: id = "%s", correlation_id = %s, input_count = %d, requested_output_count = %d',
                r,
                work.context.request_id,
                work.context.correlation_id or 0,
                len(work.inputs),
                len(work.outputs),
            )
        for name in work.outputs:
            index = name[len("OUTPUT") :]
            array = work.inputs.get(f"INPUT{index}")
            if array is not None:
                size = byte_size(array)
                if verbose:
                    log.debug(
                        "\tinput INPUT%s: datatype = %s, shape = %s, byte_size = %d, buffer_count = 1",
                        index,
                        protocol_dtype(array.dtype),
                        _shape_text(array.shape),
                        size,
                    )
                    log.debug("\trequested_output %s", name)
                self.input_bytes.increment(float(size))
                outputs[name] = array
                continue
            tensor = self.inputs.get(index)
            if tensor is None or not tensor.optional:
                return ModelError(f"failed to get input 'INPUT{index}'", Code.UNSUPPORTED)
            shape = lead + [1 if d == -1 else d for d in _shape(tensor)]
            outputs[name] = np.zeros(shape, dtype=numpy_dtype(tensor.datatype))
        return Answer(outputs, dict(PARAMETERS))


def byte_size(array: np.ndarray) -> int:
    """The input's size as Triton holds it: a BYTES tensor's serialized elements (4-byte length each)."""
    return len(serialize_bytes(array)) if array.dtype == np.object_ else array.nbytes


BACKEND = Backend("", IdentityInstance)
