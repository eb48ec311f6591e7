"""Triton error codes and the HTTP status each maps to (docs/triton-spec.md §1.2)."""

from __future__ import annotations

from enum import StrEnum


class Code(StrEnum):
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"
    FORBIDDEN = "FORBIDDEN"  # Shoal's own, for restricted APIs (Triton answers 403 too)


_HTTP_STATUS = {
    Code.INTERNAL: 500,
    Code.NOT_FOUND: 404,
    Code.UNAVAILABLE: 503,
    Code.UNSUPPORTED: 501,
    Code.FORBIDDEN: 403,
}


def http_status(code: Code | str) -> int:
    """Triton's `HttpCodeFromError`: everything not listed is 400."""
    return _HTTP_STATUS.get(Code(code), 400)


class ShoalError(Exception):
    """An error with a Triton code; its message is what the client sees."""

    def __init__(self, message: str, code: Code = Code.INVALID_ARG) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    @property
    def http_status(self) -> int:
        return http_status(self.code)


def invalid(message: str) -> ShoalError:
    return ShoalError(message, Code.INVALID_ARG)


def not_found(message: str) -> ShoalError:
    return ShoalError(message, Code.NOT_FOUND)


def unavailable(message: str) -> ShoalError:
    return ShoalError(message, Code.UNAVAILABLE)


def internal(message: str) -> ShoalError:
    return ShoalError(message, Code.INTERNAL)


def unsupported(message: str) -> ShoalError:
    return ShoalError(message, Code.UNSUPPORTED)
