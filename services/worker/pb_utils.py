"""`triton_python_backend_utils`: the module Triton python-backend models import.

A pure-Python module with the names `model.py` files use (triton-spec Appendix A), so those
models run unchanged inside a Shoal worker. Registered in `sys.modules` under Triton's name
by the python backend before a model is imported.

Not here yet: BLS (`InferenceRequest(...).exec()`), decoupled response senders, DLPack,
metrics families and model control from inside a model.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from shared.datatypes import config_to_protocol, deserialize_bytes, numpy_dtype, serialize_bytes

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

_log = logging.getLogger("shoal.python_model")


class TritonError(Exception):
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)
    _NAMES = ("UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED",
              "ALREADY_EXISTS", "CANCELLED")

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def code_name(self) -> str:
        return self._NAMES[self._code] if 0 <= self._code < len(self._NAMES) else "INTERNAL"


class TritonModelException(Exception):
    pass


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


class InferenceRequest:
    """A request as `execute` receives it."""

    def __init__(self, inputs: list[Tensor], request_id: str = "", correlation_id: int | str = 0,
                 requested_output_names: list[str] | None = None, parameters: dict | None = None,
                 flags: int = 0, timeout: int = 0, **_: Any) -> None:
        self._inputs = inputs
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._outputs = requested_output_names or []
        self._parameters = parameters or {}
        self._flags = flags
        self._timeout = timeout

    def inputs(self) -> list[Tensor]:
        return self._inputs

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

    def is_cancelled(self) -> bool:
        return False

    def exec(self, *args: Any, **kwargs: Any):
        raise TritonModelException("BLS requests (InferenceRequest.exec) are not supported by Shoal yet")

    async def async_exec(self, *args: Any, **kwargs: Any):
        raise TritonModelException("BLS requests (InferenceRequest.async_exec) are not supported by Shoal yet")


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None,
                 parameters: dict | None = None) -> None:
        self._outputs = output_tensors or []
        self._error = error
        self._parameters = parameters or {}

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


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
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


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
