"""PyTriton's client exceptions."""

from __future__ import annotations

from shoal.pytriton.exceptions import MessageError


class PyTritonClientError(MessageError):
    """Generic client exception (a hierarchy of its own, as in PyTriton)."""


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
