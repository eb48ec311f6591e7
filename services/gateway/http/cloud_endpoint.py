"""What the cloud platforms' endpoints share (`vertex_ai.py`, `sagemaker.py`, as tritonserver's
`src/vertex_ai_server.cc` and `src/sagemaker_server.cc`, both subclasses of its HTTP server): a
port of their own whose routes are rewritten to the gateway's KServe HTTP API and answered by
the gateway's own HTTP app, so the answers, errors and restrictions are the HTTP endpoint's; the
JSON header size of a binary request given in the content type; the answers of their own."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from services.gateway.http.protocol import Disconnect
from services.gateway.http.restricted import HttpApp

Scope = dict[str, Any]
App = Callable[..., Any]  # an ASGI application: (scope, receive, send) -> awaitable
Channel = Callable[..., Any]  # an ASGI receive or send
Answer = tuple[int, bytes, dict[str, str]]

_LEADING_INT = re.compile(r"\s*[+-]?[0-9]+")


def header_length(mime: str, content_type: str, content_length: int | None) -> int | None:
    """The JSON header's size a binary request gives in its content type, `<mime><size>` (None: all
    JSON); raises ValueError with tritonserver's text."""
    at = content_type.find(mime)
    if at < 0:
        return None
    if at != 0:
        raise ValueError(f"expect MIME type for binary data starts with '{mime}', got: {content_type}")
    given = content_type[len(mime) :]
    number = _LEADING_INT.match(given)  # std::stoi: the leading integer, whatever follows it
    if number is None:
        raise ValueError(f"Unable to parse inference header size, got: {given}")
    value = int(number.group(0))
    if value < 0 or (content_length is not None and value > content_length):
        raise ValueError(f"inference header size should be in range (0, {content_length}), got: {given}")
    return value


def with_header_length(scope: Scope, mime: str, headers: dict[str, str]) -> Scope:
    """The request with the HTTP API's `Inference-Header-Content-Length` its content type gives
    (only that: a header of that name sent to a cloud route is not theirs); raises ValueError."""
    length = header_length(mime, headers.get("content-type", ""), _int(headers.get("content-length")))
    kept = [(k, v) for k, v in scope["headers"] if k.lower() != b"inference-header-content-length"]
    if length is not None:
        kept.append((b"inference-header-content-length", str(length).encode()))
    return {**scope, "headers": kept}


def headers_of(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def at(scope: Scope, method: str, path: str) -> Scope:
    """The request as the HTTP API's `method path`."""
    return {**scope, "method": method, "path": path, "raw_path": path.encode(), "query_string": b""}


async def serve(
    http: HttpApp, scope: Scope, receive: Channel, send: Channel, reheader: Callable[[Answer], Answer] | None = None
) -> None:
    """The HTTP app's answer; inference, which its app leaves to Shoal's HTTP protocol (which hands
    it the body read whole: services/gateway/http/infer.py), is asked for the same way, and its
    answer passes through `reheader`."""
    claim = http.claim(scope["method"], scope["path"])
    if claim is None:
        await http(scope, receive, send)
        return
    body, size = await _read(receive, http.limit)
    answer = await http.respond(claim, scope["headers"], body, size, Disconnect(_nothing))
    status, content, headers = reheader(answer) if reheader is not None else answer
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw.append((b"content-length", str(len(content)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})


async def ask(http: HttpApp, scope: Scope, method: str, path: str, body: bytes = b"") -> Answer:
    """The HTTP app's answer to `method path` with `body` and the request's headers (a cloud route
    made of several of the HTTP API's requests: SageMaker's multi-model load)."""
    scope = at(scope, method, path)
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"content-length", b"content-type")]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    scope["headers"] = headers
    claim = http.claim(method, path)
    if claim is not None:
        return await http.respond(claim, headers, body, len(body), Disconnect(_nothing))
    sent: list[bytes] = []
    start: dict[str, Any] = {}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        else:
            sent.append(message.get("body", b""))

    await http(scope, receive, send)
    answered = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in start.get("headers", [])}
    return start.get("status", 500), b"".join(sent), answered


async def answer(send: Channel, reply: Answer) -> None:
    status, content, headers = reply
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items() if k != "content-length"]
    raw.append((b"content-length", str(len(content)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})


async def status(send: Channel, code: int) -> None:
    """An empty answer, as tritonserver's `evhtp_send_reply` with no body."""
    await send({"type": "http.response.start", "status": code, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


async def error(send: Channel, message: str, code: int = 400) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read(receive: Channel, limit: int) -> tuple[bytes, int]:
    """The request's body (at most `limit` bytes kept) and how many bytes came."""
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks), size


def _nothing() -> None:
    """A Disconnect's resume: uvicorn's ASGI cycle reads on its own."""


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None
