"""PyTriton's exceptions, under PyTriton's names (both spellings PyTriton has used)."""

from __future__ import annotations


class MessageError(Exception):
    """An error whose text is its `message`, as PyTriton's server and client errors both are."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    def __str__(self) -> str:
        return self._message

    @property
    def message(self) -> str:
        return self._message


class PyTritonError(MessageError):
    """Generic PyTriton exception."""


class PyTritonValidationError(PyTritonError):
    """Configuration or input validation failed; raised by an inference function, the client gets a 400."""


class PyTritonInvalidOperationError(PyTritonError):
    """An operation not allowed in the current state."""


class PyTritonBadParameterError(PyTritonError):
    """An invalid parameter."""


class PyTritonModelConfigError(PyTritonError):
    """An invalid model config."""


class PyTritonUnrecoverableError(PyTritonError):
    """Raised by an inference function: no further inference is possible, so the process stops serving."""


class PyTritonRuntimeError(PyTritonError):
    """An error that falls in no other category."""


# the spellings of PyTriton's first releases
PytritonError = PyTritonError
PytritonValidationError = PyTritonValidationError
PytritonInvalidOperationError = PyTritonInvalidOperationError
PytritonBadParameterError = PyTritonBadParameterError
PytritonModelConfigError = PyTritonModelConfigError
PytritonUnrecoverableError = PyTritonUnrecoverableError
PytritonRuntimeError = PyTritonRuntimeError
