"""HTTP/2 frames as the gRPC front end reads and writes them (RFC 9113), and gRPC's own framing.

Pure functions over bytes: the connection (services/gateway/grpc/http2/http2_connection.py) owns the state.
Header blocks the server sends use HPACK literals that never touch the dynamic table, so they
need no encoder state and the constant ones are built once (`RESPONSE_HEADERS`, `OK_TRAILERS`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# settings identifiers
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 3, 4, 5

# error codes (RST_STREAM, GOAWAY)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 11

DEFAULT_WINDOW = 65_535
DEFAULT_FRAME_SIZE = 16_384
MAX_WINDOW = 2**31 - 1
MAX_FRAME = 2**24 - 1

_header = struct.Struct(">HBBBI")  # 24-bit length as 16 + 8 bits, type, flags, stream id
_u32 = struct.Struct(">I")


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _header.pack(size >> 8, size & 0xFF, kind, flags, stream) + payload


def parse_header(data: bytes | bytearray | memoryview, at: int) -> tuple[int, int, int, int]:
    """(payload length, type, flags, stream id) of the frame header at `at`."""
    high, low, kind, flags, stream = _header.unpack_from(data, at)
    return (high << 8) | low, kind, flags, stream & 0x7FFF_FFFF


# the payload size each fixed-size frame must have (RFC 9113 §6): anything else is FRAME_SIZE_ERROR
_FIXED_SIZE = {PRIORITY: 5, RST_STREAM: 4, PING: 8, WINDOW_UPDATE: 4}


def malformed(kind: int, flags: int, payload: bytes) -> tuple[int, bytes] | None:
    """Why a frame from a client breaks the connection (error code, debug text), or None.

    The frame-level checks of RFC 9113 §6 that protect the reader: sizes of the fixed-size frames,
    padding within the payload, settings within their ranges (a MAX_FRAME_SIZE of 0 would leave
    every answer unsendable). Before: a short frame raised inside `data_received`, and the
    connection dropped without a GOAWAY, with a traceback logged per frame."""
    size = len(payload)
    fixed = _FIXED_SIZE.get(kind)
    if fixed is not None:
        return None if size == fixed else (FRAME_SIZE_ERROR, b"bad frame size")
    if kind in (DATA, HEADERS):
        if flags & PADDED and (
            size == 0 or payload[0] >= size - (5 if kind == HEADERS and flags & PRIORITY_FLAG else 0)
        ):
            return PROTOCOL_ERROR, b"bad padding"
        if kind == HEADERS and flags & PRIORITY_FLAG and size < 5 + (1 if flags & PADDED else 0):
            return FRAME_SIZE_ERROR, b"bad frame size"
    elif kind == SETTINGS:
        if size % 6 or (flags & ACK and size):
            return FRAME_SIZE_ERROR, b"bad frame size"
        return _bad_setting(payload)
    elif kind == GOAWAY and size < 8:
        return FRAME_SIZE_ERROR, b"bad frame size"
    return None


def _bad_setting(payload: bytes) -> tuple[int, bytes] | None:
    for key, value in parse_settings(payload):
        if key == ENABLE_PUSH and value > 1:
            return PROTOCOL_ERROR, b"bad ENABLE_PUSH"
        if key == INITIAL_WINDOW_SIZE and value > MAX_WINDOW:
            return FLOW_CONTROL_ERROR, b"bad INITIAL_WINDOW_SIZE"
        if key == MAX_FRAME_SIZE and not DEFAULT_FRAME_SIZE <= value <= MAX_FRAME:
            return PROTOCOL_ERROR, b"bad MAX_FRAME_SIZE"
    return None


def settings(values: Iterable[tuple[int, int]]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", key, value) for key, value in values))


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    return [struct.unpack_from(">HI", payload, at) for at in range(0, len(payload) - len(payload) % 6, 6)]


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, _u32.pack(increment))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, _u32.pack(code))


def goaway(last_stream: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream, code) + debug)


def u32(payload: bytes, at: int = 0) -> int:
    return int(_u32.unpack_from(payload, at)[0])


def unpad(flags: int, payload: bytes, priority: bool = False) -> bytes:
    """A DATA or HEADERS payload without its padding (and a HEADERS frame's priority fields)."""
    start, end = 0, len(payload)
    if flags & PADDED:
        start, end = 1, end - payload[0]
    if priority and flags & PRIORITY_FLAG:
        start += 5
    if start == 0 and end == len(payload):
        return payload
    return payload[start:end]


# -- HPACK: literal header fields without indexing (RFC 7541 §6.2.2) ------------------------------


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(text: bytes) -> bytes:
    return _integer(len(text), 7, 0) + text


def literal(name: bytes, value: bytes) -> bytes:
    """One header field, a new name, not added to the peer's dynamic table."""
    return b"\x00" + _string(name) + _string(value)


_STATUS_200 = b"\x88"  # static table entry 8
_CONTENT_TYPE = _integer(31, 4, 0x00) + _string(b"application/grpc")  # name from static entry 31
RESPONSE_HEADERS = _STATUS_200 + _CONTENT_TYPE
GZIP_RESPONSE_HEADERS = RESPONSE_HEADERS + literal(b"grpc-encoding", b"gzip")
OK_TRAILERS = literal(b"grpc-status", b"0")


def status_trailers(code: int, message: str) -> bytes:
    block = literal(b"grpc-status", str(code).encode())
    if message:
        block += literal(b"grpc-message", percent_encode(message))
    return block


def percent_encode(text: str) -> bytes:
    """grpc-message's encoding: printable ASCII but '%' as is, every other byte of its UTF-8 as %XX."""
    out = bytearray()
    for byte in text.encode():
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


def header_frames(stream: int, block: bytes, end_stream: bool, max_frame: int) -> bytes:
    """A header block as HEADERS (and CONTINUATION frames when it is larger than a frame)."""
    flags = END_STREAM if end_stream else 0
    if len(block) <= max_frame:
        return frame(HEADERS, flags | END_HEADERS, stream, block)
    chunks = [block[at : at + max_frame] for at in range(0, len(block), max_frame)]
    out = [frame(HEADERS, flags, stream, chunks[0])]
    out += [frame(CONTINUATION, 0, stream, chunk) for chunk in chunks[1:-1]]
    out.append(frame(CONTINUATION, END_HEADERS, stream, chunks[-1]))
    return b"".join(out)


# -- gRPC messages: a compressed flag and a 32-bit length before each (gRPC's PROTOCOL-HTTP2) -----

_message_prefix = struct.Struct(">BI")


def message(payload: bytes, compressed: bool = False) -> bytes:
    return _message_prefix.pack(1 if compressed else 0, len(payload)) + payload


def split_messages(buffer: bytearray) -> tuple[list[tuple[bool, bytes]], bytearray]:
    """The whole messages at the start of `buffer` (compressed?, bytes), and what is left of it."""
    out: list[tuple[bool, bytes]] = []
    at = 0
    while len(buffer) - at >= 5:
        flag, size = _message_prefix.unpack_from(buffer, at)
        if len(buffer) - at - 5 < size:
            break
        out.append((flag == 1, bytes(memoryview(buffer)[at + 5 : at + 5 + size])))
        at += 5 + size
    return out, (buffer[at:] if at else buffer)


def pending_size(buffer: bytearray) -> int:
    """The declared size of the message `buffer` starts with (0 before its prefix is whole)."""
    return int(_message_prefix.unpack_from(buffer, 0)[1]) if len(buffer) >= 5 else 0


def timeout_seconds(value: bytes) -> float | None:
    """`grpc-timeout`: up to 8 digits and a unit (H, M, S, m, u, n); None if malformed."""
    units = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
    scale = units.get(value[-1:])
    if scale is None or not value[:-1].isdigit():
        return None
    return int(value[:-1]) * scale
