"""uvicorn's httptools protocol with corked writes: one `write` syscall per response.

uvicorn writes a response's headers and its body with two `transport.write` calls, and
uvloop sends each at once: two syscalls and, with TCP_NODELAY, two packets per
response. Profiling the gateway under perf_analyzer put a quarter of its CPU in those
writes. Buffering writes until the end of the current event-loop iteration sends both
in one `writelines` call.
"""

from __future__ import annotations

import asyncio
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


class CorkedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Triton (libevhtp) serves a request that carries both `Transfer-Encoding: chunked` and a
        # Content-Length, reading it as chunked (RFC 9112 §6.3: chunked wins); its own QA sends
        # such raw binary requests. llhttp refuses them unless told to be lenient.
        self.parser.set_dangerous_leniencies(lenient_chunked_length=True)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CorkedTransport(transport, self.loop))  # type: ignore[arg-type]
