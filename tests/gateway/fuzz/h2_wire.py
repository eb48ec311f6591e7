"""Raw HTTP/2 for the gRPC front door: frames built by hand (the server's own pure encoders in
services/gateway/grpc/http2/frames.py, and hpack for request headers), hypothesis strategies for
sessions of valid, odd and broken frames, and a reader of the frames a server answers with.
Shared by tests/gateway/fuzz/ and benchmarks/fuzz_front_doors.py."""

from __future__ import annotations

import socket
import struct
import time

import hpack
from hypothesis import strategies as st

from services.gateway.grpc.http2 import frames as f
from tests.gateway.fuzz.doors import Hang

INFER = b"/inference.GRPCInferenceService/ModelInfer"
READY = b"/inference.GRPCInferenceService/ServerReady"


def request_block(path: bytes = INFER, extra: list[tuple[bytes, bytes]] | None = None) -> bytes:
    """A gRPC request's header block (a fresh encoder: no dynamic-table state shared across blocks)."""
    headers = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path),
        (b":authority", b"fuzz"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        *(extra or []),
    ]
    encoder = hpack.Encoder()
    encoder.header_table_size = 0
    return bytes(encoder.encode(headers))


def call(stream: int, message: bytes, path: bytes = INFER, compressed: bool = False) -> bytes:
    """HEADERS and one DATA frame that ends the stream: a whole unary call."""
    return f.frame(f.HEADERS, f.END_HEADERS, stream, request_block(path)) + f.frame(
        f.DATA, f.END_STREAM, stream, f.message(message, compressed)
    )


def preface(*settings: tuple[int, int]) -> bytes:
    return f.PREFACE + f.settings(settings)


def server_frames(raw: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each whole frame a server sent."""
    out, at = [], 0
    while len(raw) - at >= 9:
        length, kind, flags, stream = f.parse_header(raw, at)
        if len(raw) - at - 9 < length:
            break
        out.append((kind, flags, stream, raw[at + 9 : at + 9 + length]))
        at += 9 + length
    return out


def goaway_code(raw: bytes) -> int | None:
    for kind, _, _, payload in server_frames(raw):
        if kind == f.GOAWAY:
            return int(struct.unpack_from(">I", payload, 4)[0])
    return None


FINAL_STREAM = 2**30 + 1  # above every stream id a session opens


def session(port: int, data: bytes, deadline_s: float) -> bytes:
    """Send a session, then, on the same connection, sane settings and one more call (ServerReady).
    Return what the server sent once that call ended or the server closed the connection. A
    connection left open with the call unanswered past the deadline is a hang (a wedged
    connection); one closed without a GOAWAY saying why is a failure too (RFC 9113 §5.4.1)."""
    final = f.settings([(f.INITIAL_WINDOW_SIZE, 65_535), (f.MAX_FRAME_SIZE, 16_384)])
    final += f.window_update(0, 2**30) + call(FINAL_STREAM, b"", READY)
    ends = time.monotonic() + deadline_s
    with socket.create_connection(("127.0.0.1", port), timeout=deadline_s) as sock:
        try:
            sock.sendall(data + final)
        except OSError:  # closed on the session's bytes: what it said is still readable
            pass
        out, ended = _until_ended(sock, FINAL_STREAM, ends)
    if not ended and not _client_went_away(data):
        assert goaway_code(out) is not None, f"closed without a GOAWAY: {server_frames(out)[-5:]}"
    return out


def _client_went_away(data: bytes) -> bool:
    """The session sent a GOAWAY of its own: the server may then close without one."""
    frames = server_frames(data[len(f.PREFACE) :]) if data.startswith(f.PREFACE) else []
    return any(kind == f.GOAWAY for kind, _, _, _ in frames)


def _until_ended(sock: socket.socket, stream: int, ends: float) -> tuple[bytes, bool]:
    """What the server sent, and whether `stream` ended (False: the connection closed first)."""
    out = bytearray()
    while True:
        left = ends - time.monotonic()
        if left <= 0:
            raise Hang(f"call {stream} unanswered and the connection open: {server_frames(bytes(out))[-5:]}")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return bytes(out), False
        if not chunk:
            return bytes(out), False
        out += chunk
        for kind, flags, sid, _ in server_frames(bytes(out)):
            if sid == stream and (kind == f.RST_STREAM or (kind in (f.HEADERS, f.DATA) and flags & f.END_STREAM)):
                return bytes(out), True


# -- strategies -------------------------------------------------------------------------------------

stream_ids = st.sampled_from([0, 1, 2, 3, 5, 2**30 - 1]) | st.integers(0, 2**30 - 1)
odd_settings = st.lists(
    st.tuples(
        st.sampled_from([f.HEADER_TABLE_SIZE, f.ENABLE_PUSH, f.MAX_CONCURRENT_STREAMS, f.INITIAL_WINDOW_SIZE])
        | st.sampled_from([f.MAX_FRAME_SIZE, 6, 0, 0xFFFF]),
        st.sampled_from([0, 1, 16_383, 16_384, 2**24, 2**31 - 1, 2**31, 2**32 - 1]) | st.integers(0, 2**32 - 1),
    ),
    max_size=4,
).map(lambda pairs: b"".join(struct.pack(">HI", key, value) for key, value in pairs))


@st.composite
def odd_frames(draw: st.DrawFn) -> bytes:
    """One frame: any type, flags and stream, a payload of a fitting shape or of any bytes."""
    kind = draw(st.integers(0, 12))
    payload = draw(
        st.one_of(
            st.binary(max_size=24),
            odd_settings,
            st.builds(request_block, st.sampled_from([INFER, READY, b"/nope", b""])),
            st.binary(max_size=200).map(f.message),
            st.integers(0, 2**32 - 1).map(lambda n: struct.pack(">I", n)),
        )
    )
    return f.frame(kind, draw(st.integers(0, 255)), draw(stream_ids), payload)


@st.composite
def sessions(draw: st.DrawFn) -> bytes:
    """A connection's bytes: a preface (rarely broken), then calls and odd frames in any order."""
    start = draw(st.sampled_from([preface(), f.PREFACE, b"PRI * HTTP/2.0\r\n\r\n", b"GET / HTTP/1.1\r\n\r\n"]))
    if draw(st.integers(0, 9)) == 0:
        start = draw(st.binary(max_size=40))
    parts = [start]
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.booleans()):
            stream = draw(st.integers(0, 20)) * 2 + 1
            parts.append(call(stream, draw(st.binary(max_size=120)), draw(st.sampled_from([INFER, READY]))))
        else:
            parts.append(draw(odd_frames()))
    return b"".join(parts)
