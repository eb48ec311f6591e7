"""A raw-socket HTTP/1.1 fuzzer: hypothesis strategies for whole requests as bytes (request
lines, header blocks, framing: Content-Length, chunked encoding, pipelining, plain junk), and a
client that trickles a request a byte at a time. Shared by tests/gateway/fuzz/ and
benchmarks/fuzz_front_doors.py."""

from __future__ import annotations

import select
import socket
import time

from hypothesis import strategies as st

from tests.gateway.fuzz.kserve_inputs import json_bodies

PATHS = [
    b"/v2",
    b"/v2/health/ready",
    b"/v2/models/simple/infer",
    b"/v2/models/simple/versions/1/infer",
    b"/v2/models/simple/versions/x/infer",
    b"/v2/repository/index",
    b"/v2/repository/models/simple/load",
    b"/v2/systemsharedmemory/region/r/register",
    b"/v2/models/simple/generate",
    b"/v2/logging",
    b"/v2/trace/setting",
    b"/v2/models/%2e%2e/config",
    b"/v2/models/%ff%fe/ready",
    b"*",
    b"http://x/v2",
]
methods = st.sampled_from([b"GET", b"POST", b"PUT", b"HEAD", b"OPTIONS", b"DELETE", b"PRI", b"CONNECT"]) | st.binary(
    max_size=8
)
paths = st.sampled_from(PATHS) | st.binary(max_size=40) | st.sampled_from(PATHS).map(lambda p: p + b"?" + b"a=1&" * 50)
versions = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.1x", b""]) | st.binary(
    max_size=8
)
header_lines = st.one_of(
    st.sampled_from(
        [
            b"content-length: 10",
            b"content-length: -1",
            b"content-length: 99999999999999999999",
            b"content-length: 1, 2",
            b"transfer-encoding: chunked",
            b"transfer-encoding: gzip, chunked",
            b"transfer-encoding: identity",
            b"expect: 100-continue",
            b"connection: keep-alive",
            b"connection: upgrade",
            b"upgrade: websocket",
            b"upgrade: h2c",
            b"content-encoding: gzip",
            b"inference-header-content-length: 5",
            b" folded continuation",
            b"no colon here",
            b": no name",
            b"x\x00y: nul",
            b"host: \xff\xfe",
        ]
    ),
    st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")),
)
chunks = st.lists(
    st.tuples(
        st.sampled_from([b"5", b"0", b"ffffffffffffffffff", b"-1", b"z", b"5;ext=1", b""]), st.binary(max_size=8)
    ),
    max_size=4,
).map(lambda parts: b"".join(size + b"\r\n" + data + b"\r\n" for size, data in parts) + b"0\r\n\r\n")


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    """One connection's bytes: made-up requests, possibly pipelined, or junk."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=300))
    out = b""
    for _ in range(draw(st.integers(1, 3))):
        line = draw(methods) + b" " + draw(paths) + b" " + draw(versions)
        headers = draw(st.lists(header_lines, max_size=6))
        body = draw(st.sampled_from([b""]) | json_bodies() | chunks)
        if draw(st.booleans()):
            headers.append(b"content-length: %d" % len(body))
        out += b"\r\n".join([line, b"host: fuzz", *headers]) + b"\r\n\r\n" + body
    return out


def trickle(sock: socket.socket, data: bytes, every_s: float, until: float) -> bool:
    """Send `data` a byte every `every_s` seconds until `until`; True if the server answered or
    closed before the end (the client stops there), False if it read every byte."""
    for byte in data:
        if time.monotonic() > until:
            return False
        readable, _, _ = select.select([sock], [], [], every_s)
        if readable:
            return True
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return True
    return False
