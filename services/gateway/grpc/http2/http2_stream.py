"""One HTTP/2 stream's sending side (services/gateway/grpc/http2/http2_connection.py drives it):
what its call writes goes out as the peer's windows allow, and a streaming call waits for a
client that does not read (`drained`)."""

from __future__ import annotations

import asyncio
from typing import Protocol

from services.gateway.grpc.http2 import frames as f


class Call(Protocol):
    """A stream's gRPC side, as its connection drives it."""

    def data(self, chunk: bytes, end: bool) -> None: ...

    def reset(self) -> None: ...  # the client reset the stream, or the connection is gone


class GrpcConnection(Protocol):
    """What a stream needs of its connection (http2_connection.py's `GrpcConnection`)."""

    loop: asyncio.AbstractEventLoop
    peer_max_frame: int
    peer: str  # the client, as grpcio's `context.peer()` names it

    def write(self, data: bytes) -> None: ...

    def sent_headers(self) -> None: ...

    def send_data(self, stream: Stream, data: bytes, trailers: bytes | None) -> None: ...

    def end_stream(self, stream: Stream) -> None: ...


class Stream:
    """A stream's sending side: what its call writes goes out as the peer's windows allow."""

    __slots__ = ("id", "conn", "call", "send_window", "pending", "closed", "recv_open", "consumed", "_drained")

    def __init__(self, stream_id: int, conn: GrpcConnection, send_window: int) -> None:
        self.id = stream_id
        self.conn = conn
        self.call: Call | None = None
        self.send_window = send_window
        self.pending: list[tuple[bytes, bytes | None]] = []  # (data, trailers after it) waiting for window
        self.closed = False
        self.recv_open = True
        self.consumed = 0  # bytes received since the last WINDOW_UPDATE for this stream
        self._drained: asyncio.Future[None] | None = None  # a streaming call waiting for its client to read

    async def drained(self) -> None:
        """Until what waits for the peer's window has gone out (or the stream ended): a streaming
        call awaits it before its next message, so that a client that stops reading holds one
        message here, not every one its call produces (docs/reliability.md, "Overload")."""
        while self.pending and not self.closed:
            self._drained = self.conn.loop.create_future()
            await self._drained

    def wake(self) -> None:
        waiter = self._drained
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def send_headers(self, block: bytes) -> None:
        if not self.closed:
            self.conn.sent_headers()
            self.conn.write(f.header_frames(self.id, block, False, self.conn.peer_max_frame))

    def send(self, data: bytes, trailers: bytes | None = None) -> None:
        """Data (may be b''), then the trailers that end the stream when given."""
        if self.closed:
            return
        if self.pending:
            self.pending.append((data, trailers))
        else:
            self.conn.send_data(self, data, trailers)

    def send_trailers_only(self, block: bytes) -> None:
        """A call that fails before any message: headers and status in one frame, the stream ends."""
        if not self.closed:
            self.conn.sent_headers()
            self.conn.write(f.header_frames(self.id, block, True, self.conn.peer_max_frame))
            self.conn.end_stream(self)

    def cancel(self) -> None:
        """The server gives up on the stream (RST_STREAM CANCEL)."""
        if not self.closed:
            self.conn.write(f.rst_stream(self.id, f.CANCEL))
            self.conn.end_stream(self)
