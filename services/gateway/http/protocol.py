"""uvicorn's httptools protocol with corked writes: one `write` syscall per response.

uvicorn writes a response's headers and its body with two `transport.write` calls, and
uvloop sends each at once: two syscalls and, with TCP_NODELAY, two packets per
response. Profiling the gateway under perf_analyzer put a quarter of its CPU in those
writes. Buffering writes until the end of the current event-loop iteration sends both
in one `writelines` call.

It also tells a request's handler when its client goes away (`Disconnect`, in the ASGI
scope's extensions) from `connection_lost`, so the handler needs no watcher task per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


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

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


DISCONNECT = "shoal.disconnect"  # the scope extension that holds a request's `Disconnect`


class Disconnect:
    """Cancels the task `watching` it when the connection is lost before the response ends."""

    __slots__ = ("task", "gone", "ended", "_resume_reading")

    def __init__(self, resume_reading: Callable[[], None]) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.gone = False
        self.ended = False  # the handler is done with it
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


class CorkedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Triton (libevhtp) serves a request that carries both `Transfer-Encoding: chunked` and a
        # Content-Length, reading it as chunked (RFC 9112 §6.3: chunked wins); its own QA sends
        # such raw binary requests. llhttp refuses them unless told to be lenient.
        self.parser.set_dangerous_leniencies(lenient_chunked_length=True)

        self._disconnects: list[Disconnect] = []  # this connection's requests (more than one when pipelined)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CorkedTransport(transport, self.loop))  # type: ignore[arg-type]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        disconnect = Disconnect(self.flow.resume_reading)
        # the requests still being handled (more than one when pipelined; handlers that never look
        # at theirs, e.g. Starlette's routes, leave it behind: keep a few)
        self._disconnects = [d for d in self._disconnects[-8:] if not d.ended]
        self._disconnects.append(disconnect)
        self.scope["extensions"] = {DISCONNECT: disconnect}  # type: ignore[dict-item]

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        disconnects, self._disconnects = self._disconnects, []
        for disconnect in disconnects:
            disconnect.lost()
