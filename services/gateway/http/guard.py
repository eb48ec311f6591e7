"""What one HTTP client may hold of the gateway: uvicorn's httptools protocol with limits
(docs/security.md, "Front doors").

uvicorn's httptools protocol has no limit of its own on a request's head and no timer before a
request's headers are whole: a client could send one endless header, or open connections and
trickle a byte now and then (slowloris), and hold memory and descriptors for as long as it
liked. Its keep-alive timer runs only between requests, and any byte stops it. Here:

- the request line and headers may take `header_bytes` (431 beyond, the connection closed);
- they must be whole within `header_timeout_s` of the connection opening, or of the first byte
  of a request that one read did not complete (408, closed): a request whose head arrives in
  one read, the common case, starts no timer at all;
- a body read through ASGI (every route but `/infer`, which `protocol.py` bounds itself) may
  take `body_bytes`; past that it is refused with Triton's size error and the connection closes.

The HTTP, metrics and OpenAI listeners all run this protocol (`services/gateway/service.py`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from services.gateway.http import codec

# The fence around uvicorn's internals (shared/private_internals.py), as in protocol.py: what this module uses
# beyond asyncio.Protocol (tests/gateway/http/test_uvicorn_fence.py names what an upgrade removed).
UVICORN_RELIED_ON: dict[type, tuple[str, ...]] = {
    HttpToolsProtocol: (
        "on_message_begin",
        "on_headers_complete",
        "on_body",
        "on_message_complete",
        "url",
        "headers",
        "cycle",
        "loop",
        "transport",
    ),
    RequestResponseCycle: ("scope", "disconnected", "message_event", "response_started", "response_complete"),
}


@dataclass(frozen=True)
class Limits:
    header_bytes: int = 64 * 1024
    header_timeout_s: float = 10.0
    body_bytes: int = 64 * 1024 * 1024


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    limits: ClassVar[Limits] = Limits()  # a listener's own: `with_limits`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # inside a request's line and headers (from the connection's start: a client that sends
        # nothing is timed out too; between requests, uvicorn's keep-alive timer runs)
        self._awaiting_head = True
        self._head_bytes = 0  # bytes read that left the head incomplete
        self._head_timer: asyncio.TimerHandle | None = None
        self._asgi_body = 0  # bytes of the current ASGI request's body
        self._read = 0  # bytes of the read being parsed
        self._refused = False  # answered with a refusal: the connection is closing

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._read = len(data)
        super().data_received(data)
        if not self._awaiting_head or self._refused:
            return  # the common case: a head whole in one read starts no timer
        self._head_bytes += len(data)
        if self._head_bytes > self.limits.header_bytes:
            self._refuse(431, f"request headers larger than {self.limits.header_bytes} bytes")
        elif self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_too_slow)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_head, self._head_bytes = True, 0

    def on_headers_complete(self) -> None:
        self._awaiting_head, self._asgi_body = False, 0
        self._stop_head_timer()
        if self._refused:
            return
        # a head whole in one read may still be too large: measured only when the bytes read could be
        if self._head_bytes + self._read > self.limits.header_bytes and self._head_size() > self.limits.header_bytes:
            self._refuse(431, f"request headers larger than {self.limits.header_bytes} bytes")
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        """A body going to an ASGI app (uvicorn keeps all of it until the app reads it)."""
        if self._refused:
            return
        cycle = self.cycle
        self._asgi_body += len(body)
        if self._asgi_body <= self.limits.body_bytes or cycle.response_started or cycle.response_complete:
            super().on_body(body)
            return
        declared = dict(cycle.scope["headers"]).get(b"content-length", b"")
        size = int(declared) if declared.isdigit() else self._asgi_body
        # the app waits in `receive`: it sees the client gone, and whatever it sends is dropped
        cycle.disconnected = True
        cycle.message_event.set()
        self._refuse(400, codec.size_error(size, self.limits.body_bytes).message)

    def on_message_complete(self) -> None:
        if not self._refused:  # the rest of a refused request's read is parsed, and dropped
            super().on_message_complete()

    def _head_size(self) -> int:
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._awaiting_head and not self.transport.is_closing():
            self._refuse(408, f"request headers not received within {self.limits.header_timeout_s:g} s")

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _refuse(self, status: int, message: str) -> None:
        """Triton's `{"error": ...}`, then the connection closes: the rest of the request is not read."""
        self._refused = True
        content = orjson.dumps({"error": message})
        head = b"%scontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        self.transport.write(head % (STATUS_LINE[status], len(content)) + content)
        self.transport.close()


def with_limits(base: type[GuardedHttpToolsProtocol], limits: Limits) -> type[GuardedHttpToolsProtocol]:
    """`base` for one listener, with its limits (uvicorn makes each connection's protocol from a class)."""
    return type(base.__name__, (base,), {"limits": limits})
