"""HTTP/2 and gRPC framing as the gRPC server writes and reads it (services/gateway/grpc/http2/frames.py)."""

from __future__ import annotations

import urllib.parse

import hpack
from hypothesis import given
from hypothesis import strategies as st

from services.gateway.grpc.http2 import frames as f

header_names = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=40).map(str.encode)
header_values = st.binary(max_size=300).map(lambda b: bytes(c for c in b if 0x20 <= c <= 0x7E))


def frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, at = [], 0
    while at < len(data):
        length, kind, flags, stream = f.parse_header(data, at)
        out.append((kind, flags, stream, data[at + 9 : at + 9 + length]))
        at += 9 + length
    return out


@given(st.lists(st.binary(max_size=200), max_size=6), st.integers(0, 30))
def test_messages_split_whole_and_keep_the_rest(payloads, cut):
    wire = b"".join(f.message(p) for p in payloads)
    whole, rest = f.split_messages(bytearray(wire[: len(wire) - cut] if cut < len(wire) else b""))
    joined = b"".join(f.message(p) for _, p in whole) + bytes(rest)
    assert joined == (wire[: len(wire) - cut] if cut < len(wire) else b"")
    assert [p for _, p in whole] == payloads[: len(whole)]
    assert not any(compressed for compressed, _ in whole)


@given(st.lists(st.tuples(header_names, header_values), min_size=1, max_size=40), st.sampled_from([16, 100, 16384]))
def test_header_blocks_decode_to_what_was_sent_in_frames_of_any_size(fields, max_frame):
    block = b"".join(f.literal(name, value) for name, value in fields)
    wire = f.header_frames(7, block, True, max_frame)
    parts = frames_of(wire)
    assert parts[0][0] == f.HEADERS and parts[0][1] & f.END_STREAM and parts[0][2] == 7
    assert all(kind == f.CONTINUATION for kind, *_ in parts[1:])
    assert parts[-1][1] & f.END_HEADERS and all(len(p[3]) <= max_frame for p in parts)
    decoded = hpack.Decoder().decode(b"".join(p[3] for p in parts), raw=True)
    assert decoded == fields


def test_constant_blocks_are_grpc_responses():
    decoder = hpack.Decoder()
    assert decoder.decode(f.RESPONSE_HEADERS) == [(":status", "200"), ("content-type", "application/grpc")]
    assert decoder.decode(f.OK_TRAILERS) == [("grpc-status", "0")]
    assert decoder.decode(f.status_trailers(5, "no 'x' ¡ 100%")) == [
        ("grpc-status", "5"),
        ("grpc-message", "no 'x' %C2%A1 100%25"),
    ]


@given(st.text(max_size=200))
def test_status_messages_percent_decode_to_their_text(text):
    assert urllib.parse.unquote(f.percent_encode(text).decode("ascii"), errors="strict") == text


def test_timeouts():
    assert f.timeout_seconds(b"30S") == 30.0
    assert f.timeout_seconds(b"250m") == 0.25
    assert f.timeout_seconds(b"2H") == 7200.0
    assert f.timeout_seconds(b"10x") is None and f.timeout_seconds(b"S") is None


def test_padding_and_priority_are_stripped():
    padded = bytes([3]) + b"body" + b"\0\0\0"
    assert f.unpad(f.PADDED, padded) == b"body"
    with_priority = bytes([2]) + b"\0\0\0\1\x10" + b"block" + b"\0\0"
    assert f.unpad(f.PADDED | f.PRIORITY_FLAG, with_priority, priority=True) == b"block"


def test_settings_round_trip():
    wire = f.settings([(f.INITIAL_WINDOW_SIZE, 1 << 20), (f.MAX_FRAME_SIZE, 1 << 14)])
    ((kind, flags, stream, payload),) = frames_of(wire)
    assert (kind, flags, stream) == (f.SETTINGS, 0, 0)
    assert f.parse_settings(payload) == [(f.INITIAL_WINDOW_SIZE, 1 << 20), (f.MAX_FRAME_SIZE, 1 << 14)]
