"""uvicorn's httptools protocol with corked writes: one `write` syscall per response.

uvicorn writes a response's headers and its body with two `transport.write` calls, and
uvloop sends each at once: two syscalls and, with TCP_NODELAY, two packets per
response. Profiling the gateway under perf_analyzer put a quarter of its CPU in those
writes. Buffering writes until the end of the current event-loop iteration sends both
in one `writelines` call.

Requests the app `claim`s (inference: services/gateway/http/infer.py) skip ASGI: the body is
read here, the one reader of an inference body (kept up to the app's `limit`, counted beyond it),
the handler answers status, body and headers, and the response leaves in one write: no ASGI
receive/send messages, no uvicorn response checks, no corked flush (with the batched
acknowledgements, the gateway's CPU per request fell by a fifth: docs/performance.md). Pipelined
requests take the same path in their turn, and `Expect: 100-continue` gets its interim response
as the body is asked for. The handler learns that its client went away from `connection_lost`
(`Disconnect`), so it needs no watcher task per request. Only a server at its concurrency limit
answers a claimable request through ASGI (uvicorn's 503).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from services.gateway.http.guard import GuardedHttpToolsProtocol
from shared import private_internals

Claim = tuple[str, str]

# The fence around uvicorn's internals (shared/private_internals.py): what this module uses of
# `HttpToolsProtocol` and its `RequestResponseCycle` beyond the asyncio.Protocol interface.
# pyproject.toml pins the uvicorn line this was tested with; tests/gateway/http/test_uvicorn_fence.py
# fails, naming it, when an installed uvicorn lacks any of it.
UVICORN_RELIED_ON: dict[type, tuple[str, ...]] = {
    HttpToolsProtocol: (
        "_start_asgi_task",  # overridden: where a request whose headers are read starts
        "on_body",
        "on_message_complete",
        "cycle",
        "parser",
        "app",
        "loop",
        "flow",
        "tasks",
        "transport",
    ),
    RequestResponseCycle: (
        "scope",
        "body",
        "more_body",
        "waiting_for_100_continue",
        "disconnected",
        "response_complete",
        "message_event",
        "keep_alive",
        "on_response",
        "default_headers",
    ),
}
UVICORN_BEHAVIOUR: tuple[private_internals.Behaviour, ...] = (
    (HttpToolsProtocol.on_headers_complete, "self._start_asgi_task(self.cycle, app)"),
    (HttpToolsProtocol.on_response_complete, "self._start_asgi_task(cycle, app)"),  # pipelined requests
)


class CorkedTransport:
    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._buffer: list[bytes] = []
        self._scheduled = False

    def write(self, data: bytes) -> None:
        self._buffer.append(data)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        if self._buffer:
            buffer, self._buffer = self._buffer, []
            if not self._transport.is_closing():
                self._transport.writelines(buffer)

    def write_now(self, data: bytes) -> None:
        """One whole response: nothing to merge it with, so no flush scheduled for it."""
        if self._buffer:
            self.flush()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class Disconnect:
    """Cancels the task `watching` it when the connection is lost before the response ends."""

    __slots__ = ("task", "gone", "_resume_reading")

    def __init__(self, resume_reading: Callable[[], None]) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.gone = False
        self._resume_reading = resume_reading

    def watch(self, task: asyncio.Task[Any] | None) -> None:
        """Cancel `task` if the client goes away. Reading resumes (uvicorn pauses it while a large
        body waits to be read): a closed connection only shows up to a transport that reads."""
        self.task = task
        self._resume_reading()

    def lost(self) -> None:
        self.gone = True
        if self.task is not None and not self.task.done():
            self.task.cancel()


@runtime_checkable
class DirectHandler(Protocol):
    """An app that answers some requests without ASGI, from their whole body."""

    limit: int  # bytes of body kept; more is counted and dropped (the handler refuses it)

    def claim(self, method: str, path: str) -> Claim | None: ...

    async def respond(
        self, claim: Claim, headers: Iterable[tuple[bytes, bytes]], body: bytes, size: int, disconnect: Disconnect
    ) -> tuple[int, bytes, dict[str, str]]: ...


class CorkedHttpToolsProtocol(GuardedHttpToolsProtocol):  # the limits on heads and ASGI bodies: guard.py
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Triton (libevhtp) serves a request that carries both `Transfer-Encoding: chunked` and a
        # Content-Length, reading it as chunked (RFC 9112 §6.3: chunked wins); its own QA sends
        # such raw binary requests. llhttp refuses them unless told to be lenient.
        self.parser.set_dangerous_leniencies(lenient_chunked_length=True)

        self._disconnects: set[Disconnect] = set()  # this connection's claimed requests being answered
        self._direct = self.app if isinstance(self.app, DirectHandler) else None
        self._reading: tuple[RequestResponseCycle, Claim] | None = None  # a claimed request's body coming in
        self._size = 0  # its bytes so far
        self._answered = False  # answered before its body ended (far too large): the rest is dropped

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CorkedTransport(transport, self.loop))  # type: ignore[arg-type]

    # -- claimed requests, without ASGI ----------------------------------------------------
    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        direct = self._direct
        claim = None
        if direct is not None and app is direct:
            claim = direct.claim(cycle.scope["method"], cycle.scope["path"])
        if claim is None:
            super()._start_asgi_task(cycle, app)
            return
        if cycle.waiting_for_100_continue:  # the client waits for this before it sends the body
            cycle.waiting_for_100_continue = False
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if cycle.more_body:
            self._reading, self._size, self._answered = (cycle, claim), len(cycle.body), False
        else:  # a pipelined request, read whole while it waited its turn
            self._launch(cycle, claim, len(cycle.body))

    def on_body(self, body: bytes) -> None:
        reading = self._reading
        if reading is None or reading[0] is not self.cycle:
            super().on_body(body)
            return
        cycle, claim = reading
        self._size += len(body)
        limit = self._direct.limit  # type: ignore[union-attr]  # set whenever something is being read
        if self._size <= limit:
            cycle.body += body
        elif self._size > 4 * limit and not self._answered:
            # not worth waiting for the rest: answer now (the size error), and read and drop what
            # still comes so that the client gets the answer, as the ASGI path does
            self._answered = True
            self._launch(cycle, claim, self._size)

    def on_message_complete(self) -> None:
        reading = self._reading
        if reading is None or reading[0] is not self.cycle:
            super().on_message_complete()
            return
        self._reading = None
        cycle, claim = reading
        cycle.more_body = False
        if not self._answered:
            self._launch(cycle, claim, self._size)

    def _launch(self, cycle: RequestResponseCycle, claim: Claim, size: int) -> None:
        disconnect = Disconnect(self.flow.resume_reading)
        self._disconnects.add(disconnect)
        task = self.loop.create_task(self._respond(cycle, claim, size, disconnect))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _respond(self, cycle: RequestResponseCycle, claim: Claim, size: int, disconnect: Disconnect) -> None:
        try:
            scope = cycle.scope
            body = bytes(cycle.body)
            cycle.body = bytearray()
            status, content, headers = await self._direct.respond(  # type: ignore[union-attr]
                claim, scope["headers"], body, size, disconnect
            )
            if self.flow.write_paused and not cycle.disconnected:  # a client that does not read: wait for it
                await self.flow.drain()
        except BaseException:  # cancelled at shutdown, or a bug: no answer, so the connection goes (as uvicorn)
            if not cycle.response_complete:
                self.transport.close()
            raise
        finally:
            self._disconnects.discard(disconnect)
        if cycle.disconnected:
            return
        self.transport.write_now(_response(status, headers, content, cycle))  # type: ignore[attr-defined]
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            self.transport.close()
        cycle.on_response()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        disconnects, self._disconnects = self._disconnects, set()
        for disconnect in disconnects:
            disconnect.lost()


def _response(status: int, headers: dict[str, str], content: bytes, cycle: RequestResponseCycle) -> bytes:
    """Status line, uvicorn's default headers (date, server), the handler's, length and close."""
    parts = [STATUS_LINE[status]]
    for name, value in cycle.default_headers:
        parts += [name, b": ", value, b"\r\n"]
    for key, text in headers.items():
        parts += [key.encode("latin-1"), b": ", text.encode("latin-1"), b"\r\n"]
    parts += [b"content-length: ", str(len(content)).encode(), b"\r\n"]
    if not cycle.keep_alive:
        parts.append(b"connection: close\r\n")
    parts += [b"\r\n", content]
    return b"".join(parts)
