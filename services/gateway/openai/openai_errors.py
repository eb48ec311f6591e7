"""OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

The official `openai` client turns the status into its exception class (400 `BadRequestError`,
404 `NotFoundError`, ...) and reads the message from this body (docs/openai.md, "Errors").
"""

from __future__ import annotations

from typing import Any

import orjson

from shared.errors import Code, ShoalError

_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 499: "cancelled", 503: "server_error"}


class OpenAIError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code

    def document(self) -> dict[str, Any]:
        kind = _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def body(self) -> bytes:
        return orjson.dumps(self.document())


def refused(param: str, why: str) -> OpenAIError:
    """A parameter the model cannot honour: refused, never ignored."""
    return OpenAIError(f"'{param}' is not supported: {why}", 400, param=param, code="unsupported_parameter")


def invalid_value(param: str, why: str) -> OpenAIError:
    return OpenAIError(f"invalid '{param}': {why}", 400, param=param, code="invalid_value")


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        f"The model '{model}' does not exist or cannot serve this endpoint", 404, param="model", code="model_not_found"
    )


def from_shoal(exc: ShoalError) -> OpenAIError:
    """A Triton error from the core keeps its text and its status (Triton's code → HTTP status)."""
    code = "model_not_found" if exc.code == Code.NOT_FOUND else exc.code.lower()
    return OpenAIError(exc.message, exc.http_status, code=code)
