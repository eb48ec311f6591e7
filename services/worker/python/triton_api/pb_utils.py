"""`triton_python_backend_utils`: the module Triton python-backend models import.

A pure-Python module with the names `model.py` files use (docs/triton-spec.md Appendix A), so those
models run unchanged inside a Shoal worker. Registered in `sys.modules` under Triton's name
by the python backend before a model is imported.

The worker plugs itself in through `install_runtime` (BLS requests go through the
scheduler like any client's) and through the per-request response senders and
cancellation checks it hands to `InferenceRequest`. Errors, the auto-complete config and
custom metrics (`MetricFamily`, published with the worker's heartbeats) and response senders are in
`triton_errors`, `autocomplete_config`, `custom_metrics` and `response_sender`, re-exported here
under Triton's names.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

# names of this module that live in modules of their own (one concern each)
from services.worker.python.triton_api.autocomplete_config import ModelConfig  # noqa: F401
from services.worker.python.triton_api.custom_metrics import Metric, MetricFamily, metrics_snapshot  # noqa: F401
from services.worker.python.triton_api.response_sender import (  # noqa: F401
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceResponseSender,
)
from services.worker.python.triton_api.triton_errors import TritonError, TritonModelException
from shared.config.datatypes import config_to_protocol, deserialize_bytes, numpy_dtype, serialize_bytes

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

_log = logging.getLogger("shoal.python_model")


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name = name
        self._array = np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def is_cpu(self) -> bool:
        return True

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def to_dlpack(self) -> Any:
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        """From a DLPack capsule or any object with `__dlpack__` (torch, cupy: copied to host)."""
        if hasattr(capsule, "__dlpack__"):
            device = getattr(capsule, "__dlpack_device__", lambda: (1, 0))()
            if device[0] != 1:  # a GPU tensor: this shim keeps tensors on the host
                capsule = capsule.get() if hasattr(capsule, "get") else capsule.cpu()  # cupy / torch
            return Tensor(name, np.from_dlpack(capsule))
        return Tensor(name, np.from_dlpack(_Capsule(capsule)))


class _Capsule:
    """A bare DLPack capsule, wrapped so `np.from_dlpack` accepts it."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class PreferredMemory:
    """Where BLS outputs should land; this shim always gives host (numpy) tensors."""

    def __init__(self, preferred_memory_type: int = 0, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


TRITONSERVER_MEMORY_CPU, TRITONSERVER_MEMORY_CPU_PINNED, TRITONSERVER_MEMORY_GPU = 0, 1, 2


class Runtime(Protocol):
    """What the hosting worker provides: BLS requests into the server."""

    def infer(self, request: InferenceRequest, deadline_ns: int) -> InferenceResponse: ...

    async def async_infer(self, request: InferenceRequest, deadline_ns: int) -> InferenceResponse: ...

    def stream(self, request: InferenceRequest, deadline_ns: int) -> ResponseIterator: ...

    def is_model_ready(self, model_name: str, model_version: str) -> bool: ...

    def load_model(self, model_name: str, config: str, files: dict[str, bytes] | None) -> None: ...

    def unload_model(self, model_name: str, unload_dependents: bool) -> None: ...


_runtime: Runtime | None = None
_context = threading.local()  # per instance thread: the request deadline and model directory


def install_runtime(runtime: Runtime) -> None:
    global _runtime
    _runtime = runtime


_model_dir = ""  # the last model initialized: right for threads a model starts itself when its
# worker hosts only that model (the default isolation)


def set_context(deadline_ns: int = 0, model_dir: str | None = None) -> None:
    """Called by the backend on an instance's thread before it runs model code."""
    global _model_dir
    _context.deadline_ns = deadline_ns
    if model_dir is not None:
        _context.model_dir = _model_dir = model_dir


def get_model_dir() -> str:
    return getattr(_context, "model_dir", _model_dir)


def get_deadline_ns() -> int:
    """The deadline of the request this thread runs (0: none): what BLS calls made here inherit."""
    return getattr(_context, "deadline_ns", 0)


def _bls_runtime() -> Runtime:
    if _runtime is None:
        raise TritonModelException("BLS requests need a running Shoal worker")
    return _runtime


class InferenceTrace:
    """`request.trace()`: the request's trace, passed on to a BLS request (`trace=request.trace()`)
    to make its spans children of this request's (python_backend's `InferenceTrace`)."""

    def __init__(self, context: tuple[str, str] | None = None) -> None:
        self.context = context  # (traceparent, tracestate); Shoal's, for the BLS runtime

    def get_context(self) -> str | None:
        """The W3C context of the request's span as JSON (`{"traceparent": ...}`), or None when
        the request is not traced in opentelemetry mode."""
        if self.context is None:
            return None
        traceparent, tracestate = self.context
        return json.dumps({"traceparent": traceparent, **({"tracestate": tracestate} if tracestate else {})})


class InferenceRequest:
    """A request as `execute` receives it, or a BLS request a model builds and runs with `exec()`."""

    def __init__(
        self,
        model_name: str = "",
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        correlation_id: int | str = 0,
        request_id: str = "",
        flags: int = 0,
        timeout: int = 0,
        model_version: int = -1,
        preferred_memory: PreferredMemory | None = None,
        trace: Any = None,
        parameters: dict | str | None = None,
        *,
        response_sender: InferenceResponseSender | None = None,
        cancelled: Callable[[], bool] | None = None,
        **_: Any,
    ) -> None:
        # python_backend takes a bytes name too (NVIDIA's bls example passes a BYTES input's element)
        self._model_name = model_name.decode() if isinstance(model_name, bytes) else model_name
        self._model_version = model_version
        self._inputs = inputs or []
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._outputs = list(requested_output_names or [])
        self._parameters = json.loads(parameters) if isinstance(parameters, str) else dict(parameters or {})
        self._flags = flags
        self._timeout = timeout
        self._sender = response_sender
        self._cancelled = cancelled
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._trace = trace if isinstance(trace, InferenceTrace) else InferenceTrace()

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def requested_output_names(self) -> list[str]:
        return list(self._outputs)

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def trace(self) -> InferenceTrace:
        return self._trace

    def is_cancelled(self) -> bool:
        return self._cancelled() if self._cancelled is not None else False

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            # a request the model built itself (BLS) has nobody to answer
            raise TritonModelException("get_response_sender is only available on the requests execute receives")
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        """TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: run this request again in a later batch (a model
        with `sequence_batching { iterative_sequence: true }`; others fail it, as Triton's core does)."""
        self._release_flags = flags

    def _rescheduled(self) -> bool:
        return bool(self._release_flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)

    def _deadline_ns(self) -> int:
        return get_deadline_ns()

    def exec(self, decoupled: bool = False) -> InferenceResponse | ResponseIterator:
        """Run this request on another model (BLS) and wait for its response; with `decoupled=True`
        the request starts now and its responses come from the iterator returned."""
        runtime = _bls_runtime()
        if decoupled:
            return runtime.stream(self, self._deadline_ns())
        return runtime.infer(self, self._deadline_ns())

    async def async_exec(self, decoupled: bool = False) -> InferenceResponse | ResponseIterator:
        """As python_backend's: awaited, a response, or (decoupled) the same blocking iterator
        `exec(decoupled=True)` returns, iterated with a plain `for`."""
        runtime = _bls_runtime()
        if decoupled:
            return runtime.stream(self, self._deadline_ns())
        return await runtime.async_infer(self, self._deadline_ns())


class ResponseIterator:
    """A decoupled BLS request's responses, as python_backend's `ResponseIterator`: `next` blocks
    for the next response; once the last one is read, iterating again replays them all from the
    first. `cancel()` asks the target to stop; what it still sends, up to its final response (a
    CANCELLED error if it honours the cancel), is read as before. After the final one, a no-op."""

    def __init__(self, responses: Iterator[InferenceResponse], cancel: Callable[[], Any]) -> None:
        self._source = responses
        self._cancel = cancel
        self._responses: list[InferenceResponse] = []
        self._index = 0
        self._finished = False

    def __iter__(self) -> ResponseIterator:
        if self._finished and self._index >= len(self._responses):
            self._index = 0
        return self

    def __next__(self) -> InferenceResponse:
        if self._finished:
            if self._index < len(self._responses):
                self._index += 1
                return self._responses[self._index - 1]
            raise StopIteration
        try:
            response = next(self._source)
        except StopIteration:
            self._finished = True
            self._index = len(self._responses)
            raise
        self._responses.append(response)
        return response

    def cancel(self) -> None:
        if not self._finished:
            self._cancel()


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return _bls_runtime().is_model_ready(model_name, model_version)


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load or reload a model from inside a model (Triton's model control API; explicit mode)."""
    _bls_runtime().load_model(model_name, config, files)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    _bls_runtime().unload_model(model_name, unload_dependents)


class InferenceResponse:
    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict | None = None,
    ) -> None:
        self._outputs = output_tensors or []
        self._error = error
        self._parameters = parameters or {}

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters)


class Logger:
    @staticmethod
    def log_info(message: str) -> None:
        _log.info(message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning(message)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error(message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug(message)


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in request.inputs():  # a loop, not next(generator): called per input of every request
        if tensor._name == name:
            return tensor
    return None


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in response.output_tensors():
        if tensor._name == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    return next((i for i in model_config.get("input", []) if i.get("name") == name), None)


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    return next((o for o in model_config.get("output", []) if o.get("name") == name), None)


def triton_string_to_numpy(triton_type: str) -> type:
    datatype = config_to_protocol(triton_type)
    return np.object_ if datatype == "BYTES" else numpy_dtype(datatype).type


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def serialize_byte_tensor(array: np.ndarray) -> np.ndarray:
    return np.frombuffer(serialize_bytes(array), dtype=np.uint8)


def deserialize_bytes_tensor(buffer: bytes) -> np.ndarray:
    return deserialize_bytes(buffer)
