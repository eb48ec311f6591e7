"""One HTTP/2 connection of the gRPC front end: an asyncio protocol (uvloop's, in the gateway).

Why not grpcio's server: its C core runs beside the event loop and hands every call to it through
its own threads (3–4 hand-offs per unary call), and each call arrives in its own loop iteration
(docs/grpc.md). Here the frames of one read are parsed in one `data_received`: every call they
complete starts in the same iteration, so the dispatcher sends them to the scheduler in one bus
message, and the answers that end in one iteration leave in one write (`_flush`).

The connection knows HTTP/2 only (frames, header blocks, flow control, pings); a stream's gRPC
side is the `Call` its `Calls` opens (services/gateway/grpc/http2/grpc_calls.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

import hpack

from services.gateway.grpc.http2 import frames as f
from services.gateway.grpc.http2.header_blocks import HeaderDecoder
from services.gateway.grpc.http2.http2_stream import Call, Stream

__all__ = ["Call", "Calls", "GrpcConnection", "KeepAlive", "Stream"]

log = logging.getLogger("shoal.gateway")

RECV_WINDOW = 1 << 24  # what each stream, and the connection, may send before we acknowledge it
MAX_RECV_FRAME = (1 << 24) - 1  # large tensors arrive in few frames
MAX_STREAMS = 1024  # calls open at once on one connection (advertised; more are REFUSED_STREAM, retried)
MAX_HEADER_BLOCK = 1 << 20  # a request's header block, CONTINUATIONs included (as the decoder's list size)


class Calls(Protocol):
    def open(self, stream: Stream, headers: list[tuple[bytes, bytes]]) -> Call: ...


@dataclass(frozen=True)
class KeepAlive:
    """tritonserver's `--grpc-keepalive-*` and `--grpc-http2-*` flags, as gRPC core reads them."""

    time_s: float = 7200.0
    timeout_s: float = 20.0
    permit_without_calls: bool = False
    min_ping_interval_s: float = 300.0
    max_ping_strikes: int = 2
    max_pings_without_data: int = 2  # keepalive pings sent with no data in between (0: no limit)


class GrpcConnection(asyncio.Protocol):
    def __init__(self, calls: Calls, keepalive: KeepAlive, on_close: Callable[[GrpcConnection], None]) -> None:
        self._calls = calls
        self._keepalive = keepalive
        self._on_close = on_close
        self.loop = asyncio.get_event_loop()  # its calls use it too: asyncio.get_running_loop() is a getpid system call
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._preface = False
        self._decoder = HeaderDecoder()
        self._streams: dict[int, Stream] = {}
        self._last_stream = 0
        self._headers_in: tuple[int, int, list[bytes]] | None = None  # a header block awaiting CONTINUATION
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._going_away = False
        self.peer = "unknown"  # as grpcio's `context.peer()` names it
        self.peer_max_frame = f.DEFAULT_FRAME_SIZE
        self._peer_window = f.DEFAULT_WINDOW  # the connection's send window
        self._peer_initial = f.DEFAULT_WINDOW  # a new stream's send window
        self._consumed = 0  # bytes received since the last connection WINDOW_UPDATE
        self._blocked: dict[int, Stream] = {}  # streams with data waiting for window
        self._ping_timer: asyncio.TimerHandle | None = None
        self._ping_deadline: asyncio.TimerHandle | None = None
        self._last_ping_in = float("-inf")
        self._ping_strikes = 0
        self._sent_since_ping = False  # headers or data sent since the client's last ping
        self._pings_without_data = 0  # keepalive pings sent since we last sent headers or data

    # -- the transport ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = f"ipv6:[{peer[0]}]:{peer[1]}" if ":" in peer[0] else f"ipv4:{peer[0]}:{peer[1]}"
        self.write(
            f.settings(
                [
                    (f.INITIAL_WINDOW_SIZE, RECV_WINDOW),
                    (f.MAX_FRAME_SIZE, MAX_RECV_FRAME),
                    (f.ENABLE_PUSH, 0),
                    (f.MAX_CONCURRENT_STREAMS, MAX_STREAMS),
                ]
            )
        )
        self.write(f.window_update(0, RECV_WINDOW - f.DEFAULT_WINDOW))
        self._schedule_ping()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        for timer in (self._ping_timer, self._ping_deadline):
            if timer is not None:
                timer.cancel()
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.closed = True
            stream.wake()
            if stream.call is not None:
                stream.call.reset()
        self._on_close(self)

    def pause_writing(self) -> None:
        """The client does not read what we send (answers, SETTINGS and PING acknowledgements): stop
        reading what it sends until it does, so that what waits for it stays bounded (the
        transport's high-water mark) instead of growing with every request it sends meanwhile."""
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def write(self, data: bytes) -> None:
        """Corked: everything written in one loop iteration leaves in one `writelines`."""
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if self._transport is not None and not self._transport.is_closing():
            self._transport.writelines(out)

    def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()

    @property
    def idle(self) -> bool:
        return not self._streams

    def goaway(self) -> None:
        """No new streams (server shutdown); the ones open go on."""
        if not self._going_away:
            self._going_away = True
            self.write(f.goaway(self._last_stream, f.NO_ERROR))

    # -- frames in ----------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        if not self._preface:
            if len(buffer) < len(f.PREFACE):
                return
            if not buffer.startswith(f.PREFACE):
                self._connection_error(f.PROTOCOL_ERROR, b"expected the HTTP/2 preface")
                return
            self._preface = True
            del buffer[: len(f.PREFACE)]
        at, size = 0, len(buffer)
        while size - at >= 9:
            length, kind, flags, stream_id = f.parse_header(buffer, at)
            if length > MAX_RECV_FRAME:
                self._connection_error(f.FRAME_SIZE_ERROR, b"frame too large")
                return
            if size - at - 9 < length:
                break
            payload = bytes(memoryview(buffer)[at + 9 : at + 9 + length])
            at += 9 + length
            if self._headers_in is not None and kind != f.CONTINUATION:
                self._connection_error(f.PROTOCOL_ERROR, b"expected CONTINUATION")
                return
            bad = f.malformed(kind, flags, payload)
            if bad is not None:
                self._connection_error(*bad)
                return
            self._frame(kind, flags, stream_id, payload)
            if self._transport is None:
                return
        del buffer[:at]
        if self._consumed >= RECV_WINDOW // 2:
            self.write(f.window_update(0, self._consumed))
            self._consumed = 0

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == f.DATA:
            self._data(flags, stream_id, payload)
        elif kind == f.HEADERS:
            if flags & f.END_HEADERS:
                self._header_block(stream_id, flags, f.unpad(flags, payload, priority=True))
            else:
                self._headers_in = (stream_id, flags, [f.unpad(flags, payload, priority=True)])
        elif kind == f.CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == f.RST_STREAM:
            self._reset(stream_id)
        elif kind == f.SETTINGS:
            if not flags & f.ACK:
                self._settings(payload)
        elif kind == f.PING:
            self._ping(flags, payload)
        elif kind == f.GOAWAY:
            self._going_away = True
            if not self._streams:
                self.close()
        elif kind == f.WINDOW_UPDATE:
            self._window_update(stream_id, f.u32(payload) & 0x7FFF_FFFF)
        # PRIORITY, PUSH_PROMISE and unknown frames: nothing to do (RFC 9113 §5.5)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._consumed += len(payload)
        stream = self._streams.get(stream_id)
        if stream is None or not stream.recv_open:
            return  # a stream we reset or ended: its data still counts against the connection's window
        end = bool(flags & f.END_STREAM)
        if end:
            stream.recv_open = False
        else:
            stream.consumed += len(payload)
            if stream.consumed >= RECV_WINDOW // 2:
                self.write(f.window_update(stream_id, stream.consumed))
                stream.consumed = 0
        if stream.call is not None:
            stream.call.data(f.unpad(flags, payload), end)

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        pending = self._headers_in
        if pending is None or pending[0] != stream_id:
            self._connection_error(f.PROTOCOL_ERROR, b"unexpected CONTINUATION")
            return
        pending[2].append(payload)
        if sum(map(len, pending[2])) > MAX_HEADER_BLOCK:  # a CONTINUATION flood: memory, then CPU to decode
            self._connection_error(f.ENHANCE_YOUR_CALM, b"header block too large")
            return
        if flags & f.END_HEADERS:
            self._headers_in = None
            self._header_block(stream_id, pending[1], b"".join(pending[2]))

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        try:  # every block is decoded, even one we drop: the peer's encoder shares its table with us
            headers = self._decoder.decode(block)
        except hpack.HPACKError:
            self._connection_error(f.COMPRESSION_ERROR, b"undecodable header block")
            return
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers from the client (gRPC clients send none): the request ends
            if flags & f.END_STREAM and stream.recv_open:
                stream.recv_open = False
                if stream.call is not None:
                    stream.call.data(b"", True)
            return
        if stream_id <= self._last_stream or stream_id % 2 == 0:
            return  # a closed stream's trailers, or nothing a client may open
        self._last_stream = stream_id
        if self._going_away or len(self._streams) >= MAX_STREAMS:  # a stream flood holds no more than this
            self.write(f.rst_stream(stream_id, f.REFUSED_STREAM))
            return
        stream = Stream(stream_id, self, self._peer_initial)
        self._streams[stream_id] = stream
        stream.call = self._calls.open(stream, headers)
        if flags & f.END_STREAM and not stream.closed:
            stream.recv_open = False
            stream.call.data(b"", True)

    def _reset(self, stream_id: int) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            stream.closed = True
            self._blocked.pop(stream_id, None)
            if stream.call is not None:
                stream.call.reset()
            self._maybe_close()

    def _settings(self, payload: bytes) -> None:
        for key, value in f.parse_settings(payload):
            if key == f.INITIAL_WINDOW_SIZE:
                delta, self._peer_initial = value - self._peer_initial, value
                for stream in self._streams.values():
                    stream.send_window += delta
            elif key == f.MAX_FRAME_SIZE:
                self.peer_max_frame = value
            elif key == f.HEADER_TABLE_SIZE:
                pass  # our header blocks never use the dynamic table
        self.write(f.frame(f.SETTINGS, f.ACK, 0))
        self._drain()

    def _ping(self, flags: int, payload: bytes) -> None:
        if flags & f.ACK:
            if self._ping_deadline is not None:
                self._ping_deadline.cancel()
                self._ping_deadline = None
            return
        # gRPC core's policy (--grpc-http2-min-recv-ping-interval-without-data, -max-ping-strikes):
        # a client that pings too often, or with no call open when that is not permitted, is told off
        now = time.monotonic()
        if self._sent_since_ping:  # as gRPC core: sending headers or data forgives the pings before
            self._sent_since_ping = False
            self._ping_strikes = 0
            self._last_ping_in = float("-inf")
        keepalive = self._keepalive
        too_soon = now - self._last_ping_in < keepalive.min_ping_interval_s
        if (not self._streams and not keepalive.permit_without_calls) or too_soon:
            self._ping_strikes += 1
        self._last_ping_in = now
        if self._ping_strikes > keepalive.max_ping_strikes:
            self._connection_error(f.ENHANCE_YOUR_CALM, b"too_many_pings")
            return
        self.write(f.frame(f.PING, f.ACK, 0, payload))

    def _window_update(self, stream_id: int, increment: int) -> None:
        if stream_id == 0:
            self._peer_window += increment
        else:
            stream = self._streams.get(stream_id)
            if stream is None:
                return
            stream.send_window += increment
        self._drain()

    def _connection_error(self, code: int, debug: bytes) -> None:
        self.write(f.goaway(self._last_stream, code, debug))
        self.close()

    # -- frames out -------------------------------------------------------------------------
    def sent_headers(self) -> None:
        self._sent_since_ping = True
        self._pings_without_data = 0

    def send_data(self, stream: Stream, data: bytes, trailers: bytes | None) -> None:
        """As much of `data` as the windows allow; the rest (and the trailers) wait for WINDOW_UPDATE."""
        self._sent_since_ping = True
        self._pings_without_data = 0
        sent = 0
        view = memoryview(data)
        while sent < len(data):
            room = min(self._peer_window, stream.send_window, self.peer_max_frame, len(data) - sent)
            if room <= 0:
                stream.pending.insert(0, (bytes(view[sent:]), trailers))
                self._blocked[stream.id] = stream
                return
            self.write(f.frame(f.DATA, 0, stream.id, bytes(view[sent : sent + room])))
            self._peer_window -= room
            stream.send_window -= room
            sent += room
        if trailers is not None:
            self.write(f.header_frames(stream.id, trailers, True, self.peer_max_frame))
            self.end_stream(stream)

    def _drain(self) -> None:
        for stream in list(self._blocked.values()):
            if self._peer_window <= 0:
                return
            del self._blocked[stream.id]
            pending, stream.pending = stream.pending, []
            for index, (data, trailers) in enumerate(pending):
                self.send_data(stream, data, trailers)
                if stream.pending:  # blocked again: keep the order
                    stream.pending.extend(pending[index + 1 :])
                    break
            if not stream.pending:
                stream.wake()

    def end_stream(self, stream: Stream) -> None:
        """The server's side of the stream is done; a request still coming in is no longer read."""
        stream.closed = True
        stream.wake()
        self._blocked.pop(stream.id, None)
        if self._streams.pop(stream.id, None) is not None and stream.recv_open:
            self.write(f.rst_stream(stream.id, f.NO_ERROR))  # RFC 9113 §8.1: the client may stop sending
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self._going_away and not self._streams:
            self.close()

    # -- keepalive --------------------------------------------------------------------------
    def _schedule_ping(self) -> None:
        self._ping_timer = self.loop.call_later(self._keepalive.time_s, self._send_ping)

    def _send_ping(self) -> None:
        if self._transport is None:
            return
        limit = self._keepalive.max_pings_without_data
        if (self._streams or self._keepalive.permit_without_calls) and not 0 < limit <= self._pings_without_data:
            self._pings_without_data += 1
            self.write(f.frame(f.PING, 0, 0, b"shoal-ka"))
            if self._ping_deadline is None:
                self._ping_deadline = self.loop.call_later(self._keepalive.timeout_s, self._ping_timeout)
        self._schedule_ping()

    def _ping_timeout(self) -> None:
        log.info("closing a gRPC connection whose client did not answer a keepalive ping")
        self._connection_error(f.NO_ERROR, b"keepalive timeout")
