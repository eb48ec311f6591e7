"""Triton's answer to a failed HTTP request, one mapping for the `/infer` path (infer.py) and every
other route (app.py): a `ShoalError`'s status and `{"error": message}`; anything else is a bug,
answered 500 "internal error: ..." so that the server keeps serving."""

from __future__ import annotations

from services.gateway.http.codec import UNSUPPORTED_COMPRESSION, error_body
from shared.errors import ShoalError

JSON = {"content-type": "application/json"}


def error_answer(exc: Exception) -> tuple[int, bytes, dict[str, str]]:
    """The status, body and headers that answer a request that failed with `exc`."""
    headers = dict(JSON)
    if not isinstance(exc, ShoalError):
        return 500, error_body(f"internal error: {exc}"), headers
    if exc.message == UNSUPPORTED_COMPRESSION:
        headers["accept-encoding"] = "gzip, deflate"  # as Triton's answer says which it takes
    return exc.http_status, error_body(exc.message), headers  # may name bytes a client sent
