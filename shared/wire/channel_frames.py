"""The frames of the local channel (docs/design.md §9): a batch and its answers between a gateway
and a worker on one host, over a Unix-domain stream socket instead of nats-server.

A frame is one byte of kind, four bytes of length (big-endian) and the payload: an encoded
`ExecBatch` (gateway -> worker) or `BatchDone` (worker -> gateway), the same bytes NATS would
carry, after the worker's `HELLO` (its id), which the gateway waits for before it writes anything.
Pure: the reader takes whatever the socket gave and returns the whole frames in it.
"""

from __future__ import annotations

import struct

BATCH = 1  # gateway -> worker: an ExecBatch
DONE = 2  # worker -> gateway: a BatchDone
HELLO = 3  # worker -> gateway, first on every connection: the worker's id (UTF-8)
KINDS = frozenset({BATCH, DONE, HELLO})

# A batch is bounded by the bus's max_payload (a few MiB at most); a frame far beyond it is not a
# Shoal peer's: the reader refuses it instead of buffering it
MAX_FRAME = 64 * 1024 * 1024

_HEADER = struct.Struct(">BI")
HEADER_SIZE = _HEADER.size


class FrameError(Exception):
    """The bytes are not a frame stream of Shoal's: the connection is closed."""


def header(kind: int, size: int) -> bytes:
    """The five bytes that go before a payload of `size` bytes."""
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind}")
    if size > MAX_FRAME:
        raise FrameError(f"a frame of {size} bytes is over the {MAX_FRAME}-byte limit")
    return _HEADER.pack(kind, size)


class FrameReader:
    """Frames out of a byte stream cut anywhere: `feed` returns the frames completed by `data`."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        if not self._buffer and len(data) >= HEADER_SIZE:  # the common case: whole frames, no copy
            frames, used = _split(data)
            if used == len(data):
                return frames
            self._buffer += memoryview(data)[used:]
            return frames
        self._buffer += data
        frames, used = _split(self._buffer)
        del self._buffer[:used]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held back."""
        return len(self._buffer)


def _split(data: bytes | bytearray) -> tuple[list[tuple[int, bytes]], int]:
    """The whole frames at the start of `data`, and how many bytes they take."""
    frames = []
    at = 0
    end = len(data)
    while end - at >= HEADER_SIZE:
        kind, size = _HEADER.unpack_from(data, at)
        if kind not in KINDS:
            raise FrameError(f"unknown frame kind {kind}")
        if size > MAX_FRAME:
            raise FrameError(f"a frame of {size} bytes is over the {MAX_FRAME}-byte limit")
        start = at + HEADER_SIZE
        if end - start < size:
            break
        frames.append((kind, bytes(data[start : start + size])))
        at = start + size
    return frames, at
