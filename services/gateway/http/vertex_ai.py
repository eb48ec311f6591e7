"""The Vertex AI endpoint (`--allow-vertex-ai`), as tritonserver's `src/vertex_ai_server.cc`.

A port of its own (`--vertex-ai-port`) with two routes read from Vertex AI's environment:
`AIP_HEALTH_ROUTE` answers as `GET /v2/health/ready`, `AIP_PREDICT_ROUTE` infers on the default
model (`--vertex-ai-default-model`, else the one model loaded). A predict request with the header
`X-Vertex-Ai-Triton-Redirect: <KServe path>` is sent to that read-only KServe endpoint instead
(model metadata, config, readiness, statistics and inference, server health and metadata,
shared-memory status, the repository index, `/metrics`); register, load and the like are
forbidden there. Every request is rewritten and handed to the gateway's own HTTP app, so the
answers, errors and restrictions are the HTTP endpoint's.
"""

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

BINARY_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT = "x-vertex-ai-triton-redirect"

_MODEL = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?(?:/(ready|infer|config|stats))?")
_HEALTH = re.compile(r"/v2/health/(live|ready)")
_SHM = re.compile(r"/v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?/(status|register|unregister)")
_LEADING_INT = re.compile(r"\s*[+-]?[0-9]+")
_REPOSITORY = re.compile(r"/v2/repository(?:/[^/]+)?/(index|models/[^/]+/(?:load|unload))")


class NoDefaultModel(Exception):
    """No default model given, and the server has not exactly one model loaded."""


def redirected(path: str) -> tuple[str, str] | int:
    """The (method, path) a redirect header's endpoint is served as, or the status that refuses it."""
    if path in ("/metrics", "/v2/models/stats", "/v2") or _HEALTH.fullmatch(path):
        return "GET", path
    model = _MODEL.fullmatch(path)
    if model is not None:
        return ("POST" if model.group(3) == "infer" else "GET"), path
    shm = _SHM.fullmatch(path)
    if shm is not None:  # only status: registering needs the HTTP endpoint itself
        return ("GET", path) if shm.group(1) == "status" else 403
    repository = _REPOSITORY.fullmatch(path)
    if repository is not None:  # only the index: loading needs the HTTP endpoint itself
        return ("POST", path) if repository.group(1) == "index" else 403
    return 400


def header_length(content_type: str, content_length: int | None) -> int | None:
    """The JSON header's size a binary predict request gives in its content type (None: all JSON);
    raises ValueError with tritonserver's text."""
    at = content_type.find(BINARY_MIME)
    if at < 0:
        return None
    if at != 0:
        raise ValueError(f"expect MIME type for binary data starts with '{BINARY_MIME}', got: {content_type}")
    given = content_type[len(BINARY_MIME) :]
    number = _LEADING_INT.match(given)  # std::stoi: the leading integer, whatever follows it
    if number is None:
        raise ValueError(f"Unable to parse inference header size, got: {given}")
    value = int(number.group(0))
    if value < 0 or (content_length is not None and value > content_length):
        raise ValueError(f"inference header size should be in range (0, {content_length}), got: {given}")
    return value


class VertexAi:
    """The ASGI app of the Vertex AI port, over the gateway's HTTP app and its metrics app."""

    def __init__(
        self, http: HttpApp, metrics: App, predict_route: str, health_route: str, default_model: Callable[[], str]
    ) -> None:
        self.http, self.metrics = http, metrics
        self.predict, self.health = re.compile(predict_route), re.compile(health_route)
        self.default_model = default_model

    async def __call__(self, scope: Scope, receive: Channel, send: Channel) -> None:
        if scope["type"] != "http":
            await self.http(scope, receive, send)  # lifespan
            return
        path = scope["path"]
        if self.health.fullmatch(path):
            await self._serve(_at(scope, scope["method"], "/v2/health/ready"), receive, send)
            return
        if not self.predict.fullmatch(path):
            return await _status(send, 400)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        target = headers.get(REDIRECT)
        if target is None:
            return await self._infer_default(scope, headers, receive, send)
        if scope["method"] != "POST":
            return await _status(send, 405)
        where = redirected("/" + target)
        if isinstance(where, int):
            return await _status(send, where)
        if where[1] == "/metrics":
            await self.metrics(_at(scope, *where), receive, send)
            return
        await self._serve(_at(scope, *where), receive, send)

    async def _infer_default(self, scope: Scope, headers: dict[str, str], receive: Channel, send: Channel) -> None:
        try:
            model = self.default_model()
            length = header_length(headers.get("content-type", ""), _int(headers.get("content-length")))
        except (ValueError, NoDefaultModel) as exc:
            return await _error(send, str(exc))
        kept = [(k, v) for k, v in scope["headers"] if k.lower() != b"inference-header-content-length"]
        if length is not None:  # the binary form says its JSON header's size in its content type
            kept.append((b"inference-header-content-length", str(length).encode()))
        await self._serve(_at({**scope, "headers": kept}, scope["method"], f"/v2/models/{model}/infer"), receive, send)

    async def _serve(self, scope: Scope, receive: Channel, send: Channel) -> None:
        """The HTTP app's answer; inference, which its app leaves to Shoal's HTTP protocol (which
        hands it the body read whole: services/gateway/http/infer.py), is asked for the same way."""
        claim = self.http.claim(scope["method"], scope["path"])
        if claim is None:
            await self.http(scope, receive, send)
            return
        body, size = await _read(receive, self.http.limit)
        status, content, headers = await self.http.respond(claim, scope["headers"], body, size, Disconnect(_nothing))
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        raw.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": content})


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


def _at(scope: Scope, method: str, path: str) -> Scope:
    return {**scope, "method": method, "path": path, "raw_path": path.encode(), "query_string": b""}


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


async def _status(send: Channel, status: int) -> None:
    """An empty answer, as tritonserver's `evhtp_send_reply` with no body."""
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


async def _error(send: Channel, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})
