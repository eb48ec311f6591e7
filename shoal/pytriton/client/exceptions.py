"""PyTriton's client exceptions."""

from __future__ import annotations


class PyTritonClientError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    def __str__(self) -> str:
        return self._message

    @property
    def message(self) -> str:
        return self._message


class PyTritonClientValueError(PyTritonClientError):
    """Incorrect values given to the API."""


class PyTritonClientInvalidUrlError(PyTritonClientValueError):
    """The server URL is invalid."""


class PyTritonClientTimeoutError(PyTritonClientError):
    """A timeout while talking to the server (readiness, model config or inference)."""


class PyTritonClientModelUnavailableError(PyTritonClientError):
    """The model (version) is unavailable on the server."""


class PyTritonClientClosedError(PyTritonClientError):
    """The client was closed."""


class PyTritonClientModelDoesntSupportBatchingError(PyTritonClientError):
    """`infer_batch` on a model without batching."""


class PyTritonClientInferenceServerError(PyTritonClientError):
    """An error in the inference function or on the server side."""


class PyTritonClientQueueFullError(PyTritonClientError):
    """The FuturesModelClient's queue is full."""
