"""`POST /v2/models/{model}[/versions/{version}]/infer`: the HTTP body codec around the core.

Called by the HTTP protocol with the body it read, in front of Starlette: inference is the hot
path, and skipping ASGI, Starlette's middleware stack, route table and Request/Response objects
saves a measurable share of the gateway's CPU per request (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

from inference.core import InferenceCore, trace_from
from inference.header_forwarding import forwarder
from inference.on_demand import request_timeout_s
from services.gateway.http import codec
from services.gateway.http.error_answers import JSON, error_answer
from services.gateway.http.protocol import Disconnect
from shared.config.model_config import ModelSpec
from shared.errors import ShoalError

log = logging.getLogger("shoal.gateway")

_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status, self.message = status, message


async def infer(
    core: InferenceCore,
    model: str,
    version: str,
    headers: dict[str, str],
    body: bytes,
    limit: int,
    forward: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """One inference: request bytes and headers in, response bytes and headers out."""
    started = time.monotonic_ns()
    found = _resolve(core, model, version)
    if not isinstance(found, tuple) and not core.loads_on_demand(model):
        found = await core.resolve_late(model, version, found)  # raises unless this view was behind
    body = codec.decompress(body, headers.get("content-encoding"), limit)
    header_length = headers.get("inference-header-content-length")
    # Triton's header length defaults to the body's: an empty body is raw binary, as a 0 header says
    if (header_length.strip() == "0") if header_length is not None else not body:
        spec, resolved = found if isinstance(found, tuple) else await core.load_on_demand(model, version, found)
        parsed = codec.raw_request(spec, body)
    else:
        header, binary = codec.split_body(body, header_length)
        parsed = codec.parse_request(header, binary, model)
        if isinstance(found, tuple):
            spec, resolved = found
        else:  # loads it, bounded by the request's own timeout (docs/models.md, "Models on demand")
            spec, resolved = await core.load_on_demand(model, version, found, request_timeout_s(parsed.parameters))
    if forward is not None:  # --http-header-forward-pattern: matching headers become parameters
        forward(parsed.parameters)
    trace = trace_from("HTTP", headers.get("traceparent"), headers.get("tracestate")) if core.spans else None
    answer = await core.infer(spec, resolved, parsed, started_ns=started, trace=trace)
    content, json_length = codec.encode_response(model, resolved, parsed.id, answer.outputs, answer.parameters)
    out_headers = {"content-type": "application/json"}
    if json_length is not None:
        out_headers = {"content-type": "application/octet-stream", "inference-header-content-length": str(json_length)}
    encoding = codec.choose_encoding(headers.get("accept-encoding"))
    if encoding:
        content = codec.compress(content, encoding)
        out_headers["content-encoding"] = encoding
    return content, out_headers


def _resolve(core: InferenceCore, model: str, version: str) -> tuple[ModelSpec, int] | ShoalError:
    """The model, or why not (no exception raised on the way: the common case costs nothing)."""
    try:
        return core.resolve(model, version)
    except ShoalError as exc:
        return exc


class InferFastPath:
    """`POST .../infer`, answered from the body the HTTP protocol read (`claim` and `respond`,
    services/gateway/http/protocol.py: the one way in for inference, which skips uvicorn's ASGI
    request cycle); every other request goes to the Starlette app through ASGI."""

    def __init__(self, core: InferenceCore, max_input_size: int, app: Any, forward_pattern: str = "") -> None:
        self.core = core
        self.limit = max_input_size
        self.app = app
        self.forward = forwarder(forward_pattern)

    def _forwarding(self, headers: Iterable[tuple[bytes, bytes]]) -> Callable[[dict[str, Any]], None] | None:
        """What adds the request's forwarded headers to its parameters (every header, not only
        those `header_dict` keeps), or None without a pattern."""
        if self.forward is None:
            return None
        decoded = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        return functools.partial(self.forward.forward, decoded)

    def claim(self, method: str, path: str) -> tuple[str, str] | None:
        """(model, version) of a request the protocol hands to `respond`."""
        match = _INFER_PATH.match(path) if method == "POST" else None
        return None if match is None else (match.group(1), match.group(2) or "")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _INFER_PATH.match(scope["path"]) is None:
            await self.app(scope, receive, send)
            return
        if scope["method"] == "POST":  # claimed by Shoal's protocol: only another server sends it here
            status, content = 500, orjson.dumps({"error": "inference is served by Shoal's HTTP protocol only"})
        else:
            status, content = 405, orjson.dumps({"error": "Method Not Allowed"})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def respond(
        self,
        claim: tuple[str, str],
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
        size: int,
        disconnect: Disconnect,
    ) -> tuple[int, bytes, dict[str, str]]:
        """A claimed request whose body the protocol read (`size` bytes came, at most `limit` kept):
        the status, body and headers of its answer."""
        model, version = claim
        named = header_dict(headers)
        try:
            if version and not version.isdigit():
                raise _HTTPError(404, "Not Found")
            if size > self.limit:
                raise self._size_error(size, named)
            content, out_headers = await _until_lost(
                infer(self.core, model, version, named, body, self.limit, self._forwarding(headers)), disconnect
            )
            log.debug("infer '%s' done", model)
            return 200, content, out_headers
        except _HTTPError as refused:
            return refused.status, orjson.dumps({"error": refused.message}), JSON
        except ShoalError as exc:
            log.debug("infer '%s' failed with %d: %s", model, exc.http_status, exc.message)
            return error_answer(exc)
        except Exception as bug:  # a bug must still answer, and the server keeps serving
            log.exception("unhandled error on infer of '%s'", model)
            return error_answer(bug)

    def _size_error(self, size: int, headers: dict[str, str]) -> ShoalError:
        declared = headers.get("content-length", "")
        total = int(declared) if declared.isdigit() else size
        if headers.get("inference-header-content-length", "").strip() == "0":
            return codec.raw_size_error(total, self.limit)
        return codec.size_error(total, self.limit)


async def _until_lost(
    work: Coroutine[Any, Any, tuple[bytes, dict[str, str]]], disconnect: Disconnect
) -> tuple[bytes, dict[str, str]]:
    """Run the inference in this task, cancelled end to end by the connection's protocol if the
    client goes away first (services/gateway/http/protocol.py: no watcher task per request)."""
    disconnect.watch(asyncio.current_task())
    try:
        if disconnect.gone:
            work.close()
            raise _HTTPError(499, "client disconnected")
        return await work
    except asyncio.CancelledError:
        if disconnect.gone:
            raise _HTTPError(499, "client disconnected") from None
        raise
    finally:
        disconnect.task = None


# the request headers inference reads: only these are decoded (an HTTP client sends 5-10 others)
_READ = frozenset(
    {
        b"content-encoding",
        b"inference-header-content-length",
        b"accept-encoding",
        b"content-length",
        b"traceparent",  # W3C trace context, read in opentelemetry trace mode
        b"tracestate",
    }
)


def header_dict(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The headers inference reads, from ASGI's list (names lower case already); a repeated one keeps its last value."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in raw if k in _READ}
