"""`TritonError` and `TritonModelException`, as `triton_python_backend_utils` names them."""

from __future__ import annotations

from shared.errors import Code


class TritonError(Exception):
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)
    _NAMES = (
        "UNKNOWN",
        "INTERNAL",
        "NOT_FOUND",
        "INVALID_ARG",
        "UNAVAILABLE",
        "UNSUPPORTED",
        "ALREADY_EXISTS",
        "CANCELLED",
    )

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    @classmethod
    def code_of(cls, name: str) -> int:
        """The code for one of Shoal's error code names (INTERNAL for any other)."""
        return cls._NAMES.index(name) if name in cls._NAMES else cls.INTERNAL

    def code_name(self) -> Code:
        return Code(self._NAMES[self._code]) if 0 <= self._code < len(self._NAMES) else Code.INTERNAL


class TritonModelException(Exception):
    pass
