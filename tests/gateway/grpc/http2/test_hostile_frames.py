"""Shoal's gRPC server against frames a hostile client sends (services/gateway/grpc/http2/frames.py
`malformed`, http2_connection.py): each broken frame ends the connection with a GOAWAY naming why, a
CONTINUATION flood is cut off, and a client that does not read stops being read. Found by the
front-door fuzz suite (tests/gateway/fuzz/, docs/security.md "Front doors")."""

from __future__ import annotations

import asyncio
import gzip
import socket
import struct

import grpc
import hpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from services.gateway.grpc.http2 import frames as f
from services.gateway.grpc.http2 import grpc_calls as calls
from services.gateway.grpc.http2.http2_connection import MAX_HEADER_BLOCK, MAX_STREAMS, KeepAlive
from services.gateway.grpc.http2.http2_server import GrpcListener
from tests.gateway.grpc.http2.test_http2_server import INFER, SERVICE, Servicer, read_frames

FIXED = {f.PRIORITY: 5, f.RST_STREAM: 4, f.PING: 8, f.WINDOW_UPDATE: 4}


@given(st.sampled_from(sorted(FIXED)), st.integers(0, 255), st.binary(max_size=12))
def test_fixed_size_frames_of_another_size_are_malformed(kind, flags, payload):
    verdict = f.malformed(kind, flags, payload)
    assert verdict == (None if len(payload) == FIXED[kind] else (f.FRAME_SIZE_ERROR, b"bad frame size"))


@given(st.sampled_from([f.DATA, f.HEADERS]), st.integers(0, 40), st.binary(max_size=30))
def test_padding_must_fit_in_the_payload(kind, pad, rest):
    payload = bytes([pad]) + rest
    verdict = f.malformed(kind, f.PADDED, payload)
    assert (verdict is None) == (pad < len(payload)), verdict
    if verdict is None:
        assert f.unpad(f.PADDED, payload) == rest[: len(rest) - pad]
    assert f.malformed(kind, f.PADDED, b"") == (f.PROTOCOL_ERROR, b"bad padding")


@pytest.mark.parametrize(
    "key, value, error",
    [
        (f.MAX_FRAME_SIZE, 0, f.PROTOCOL_ERROR),
        (f.MAX_FRAME_SIZE, 16_383, f.PROTOCOL_ERROR),
        (f.MAX_FRAME_SIZE, 2**24, f.PROTOCOL_ERROR),
        (f.INITIAL_WINDOW_SIZE, 2**31, f.FLOW_CONTROL_ERROR),
        (f.ENABLE_PUSH, 2, f.PROTOCOL_ERROR),
        (f.MAX_FRAME_SIZE, 16_384, None),
        (f.MAX_FRAME_SIZE, 2**24 - 1, None),
        (f.INITIAL_WINDOW_SIZE, 2**31 - 1, None),
        (0xFF, 2**32 - 1, None),  # unknown settings are ignored
    ],
)
def test_settings_out_of_range_are_malformed(key, value, error):
    verdict = f.malformed(f.SETTINGS, 0, struct.pack(">HI", key, value))
    assert (verdict[0] if verdict else None) == error
    assert f.malformed(f.SETTINGS, 0, b"\x00" * 7) == (f.FRAME_SIZE_ERROR, b"bad frame size")
    assert f.malformed(f.SETTINGS, f.ACK, b"\x00" * 6) == (f.FRAME_SIZE_ERROR, b"bad frame size")


@pytest.fixture
async def port():
    listener = GrpcListener(Servicer(), SERVICE, pb, KeepAlive())
    try:
        yield await listener.start("127.0.0.1", 0)
    finally:
        await listener.stop(0)


async def goaway_after(port: int, data: bytes) -> tuple[int, bytes]:
    """The GOAWAY's error code and debug text the server answers `data` with, and it then closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f.PREFACE + f.settings([]) + data)
        frames = await read_frames(reader, lambda got: any(kind == f.GOAWAY for kind, *_ in got))
        payload = next(payload for kind, _, _, payload in frames if kind == f.GOAWAY)
        assert await asyncio.wait_for(reader.read(), 10) == b""
        return f.u32(payload, 4), payload[8:]
    finally:
        writer.close()


@pytest.mark.parametrize(
    "frame, code",
    [
        (f.frame(f.WINDOW_UPDATE, 0, 0, b"\x00\x01"), f.FRAME_SIZE_ERROR),
        (f.frame(f.RST_STREAM, 0, 1, b""), f.FRAME_SIZE_ERROR),
        (f.frame(f.PING, 0, 0, b"1234"), f.FRAME_SIZE_ERROR),
        (f.frame(f.HEADERS, f.PADDED | f.END_HEADERS, 1, b""), f.PROTOCOL_ERROR),
        (f.frame(f.DATA, f.PADDED, 1, b"\x09abc"), f.PROTOCOL_ERROR),
        (f.settings([(f.MAX_FRAME_SIZE, 0)]), f.PROTOCOL_ERROR),
    ],
    ids=[
        "short WINDOW_UPDATE",
        "empty RST_STREAM",
        "short PING",
        "padded empty HEADERS",
        "DATA padded past",
        "MAX_FRAME_SIZE 0",
    ],
)
async def test_a_broken_frame_gets_a_goaway_saying_why(port, frame, code):
    assert (await goaway_after(port, frame))[0] == code


async def test_a_continuation_flood_is_cut_off(port):
    block = f.frame(f.HEADERS, 0, 1, b"\x00")  # no END_HEADERS: CONTINUATION frames must follow
    flood = f.frame(f.CONTINUATION, 0, 1, b"\x00" * 16_384) * (MAX_HEADER_BLOCK // 16_384 + 2)
    assert await goaway_after(port, block + flood) == (f.ENHANCE_YOUR_CALM, b"header block too large")


async def test_a_client_that_does_not_read_stops_being_read(port):
    """PINGs are answered with ACKs the client never reads: the server stops reading it once its
    send buffer is full, so the client's own sends stall, instead of the server's buffer growing."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    request = f.frame(f.HEADERS, f.END_HEADERS, 1, b"")  # a stream open, so the pings are not strikes
    ping = f.frame(f.SETTINGS, 0, 0, b"")  # each one answered with an ACK
    sent, limit = 0, 256 << 20
    try:
        await loop.sock_sendall(sock, f.PREFACE + f.settings([]) + request)
        while sent < limit:
            try:
                await asyncio.wait_for(loop.sock_sendall(sock, ping * 4096), 2)
            except TimeoutError:
                break  # the server stopped reading
            sent += len(ping) * 4096
        assert sent < limit, "the server read 256 MiB from a client that never read its answers"
    finally:
        sock.close()


async def test_a_message_past_the_limit_is_refused_before_it_is_buffered_or_inflated(port, monkeypatch):
    """tritonserver's limit is 2 GiB; 1 MiB here: a message declared larger is refused at its prefix,
    and a gzip bomb is inflated only up to the limit (before: inflated whole, 1,000x its size)."""
    monkeypatch.setattr(calls, "MAX_MESSAGE", 1 << 20)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        infer = channel.unary_unary(INFER)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await infer(b"\x00" * (2 << 20), timeout=10)
        assert (err.value.code(), err.value.details()) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "Received message larger than max (2097152 vs. 1048576)",
        )
        bomb = gzip.compress(b"\x00" * (64 << 20))  # 64 KiB that inflate to 64 MiB
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            block = request_block([(b"grpc-encoding", b"gzip")])
            writer.write(f.PREFACE + f.settings([]) + f.frame(f.HEADERS, f.END_HEADERS, 1, block))
            writer.write(f.frame(f.DATA, f.END_STREAM, 1, f.message(bomb, compressed=True)))
            frames = await read_frames(
                reader, lambda got: any(k == f.HEADERS and fl & f.END_STREAM for k, fl, *_ in got)
            )
        finally:
            writer.close()
        trailers = hpack.Decoder().decode(next(p for k, _, _, p in frames if k == f.HEADERS))
        assert ("grpc-status", str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])) in trailers
        assert ("grpc-message", "Received message larger than max (1048577 vs. 1048576)") in trailers


def request_block(extra: list[tuple[bytes, bytes]]) -> bytes:
    headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", INFER.encode()), (b":authority", b"t")]
    headers += [(b"content-type", b"application/grpc"), (b"te", b"trailers"), *extra]
    return bytes(hpack.Encoder().encode(headers))


async def test_streams_past_the_advertised_limit_are_refused(port):
    """A stream flood (calls opened and never ended) holds at most MAX_STREAMS calls per connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        opened = [f.frame(f.HEADERS, f.END_HEADERS, 2 * i + 1, request_block([])) for i in range(MAX_STREAMS + 10)]
        writer.write(f.PREFACE + f.settings([]) + b"".join(opened))
        frames = await read_frames(reader, lambda got: sum(k == f.RST_STREAM for k, *_ in got) >= 10)
    finally:
        writer.close()
    settings = next(p for k, fl, _, p in frames if k == f.SETTINGS and not fl & f.ACK)
    assert (f.MAX_CONCURRENT_STREAMS, MAX_STREAMS) in f.parse_settings(settings)
    refused = [(sid, f.u32(p)) for k, _, sid, p in frames if k == f.RST_STREAM]
    assert refused == [(2 * i + 1, f.REFUSED_STREAM) for i in range(MAX_STREAMS, MAX_STREAMS + 10)]
