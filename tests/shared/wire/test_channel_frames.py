"""The local channel's frames: whatever way the socket cuts the stream, the same frames come out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.wire.channel_frames import BATCH, DONE, HEADER_SIZE, MAX_FRAME, FrameError, FrameReader, header

frames = st.lists(st.tuples(st.sampled_from([BATCH, DONE]), st.binary(max_size=300)), max_size=12)


def stream(items: list[tuple[int, bytes]]) -> bytes:
    return b"".join(header(kind, len(payload)) + payload for kind, payload in items)


@given(frames, st.lists(st.integers(min_value=1, max_value=64), max_size=40))
def test_frames_come_out_whole_however_the_stream_is_cut(items, cuts):
    data = stream(items)
    reader = FrameReader()
    out = []
    at = 0
    for cut in cuts:
        out += reader.feed(data[at : at + cut])
        at += cut
    out += reader.feed(data[at:])
    assert out == items
    assert reader.pending == 0


def test_a_partial_frame_waits_for_its_rest():
    reader = FrameReader()
    data = stream([(BATCH, b"abcdef")])
    assert reader.feed(data[: HEADER_SIZE + 2]) == []
    assert reader.pending == HEADER_SIZE + 2
    assert reader.feed(data[HEADER_SIZE + 2 :]) == [(BATCH, b"abcdef")]


def test_whole_frames_and_a_tail_in_one_read():
    reader = FrameReader()
    data = stream([(DONE, b"x"), (BATCH, b"yz")])
    assert reader.feed(data[:-1]) == [(DONE, b"x")]
    assert reader.feed(data[-1:]) == [(BATCH, b"yz")]


@pytest.mark.parametrize("junk", [b"\x07\x00\x00\x00\x01x", b"\x00\x00\x00\x00\x00"])
def test_an_unknown_kind_is_refused(junk):
    with pytest.raises(FrameError, match="unknown frame kind"):
        FrameReader().feed(junk)


def test_a_frame_over_the_limit_is_refused_before_it_is_buffered():
    too_big = (MAX_FRAME + 1).to_bytes(4, "big")
    with pytest.raises(FrameError, match="over the"):
        FrameReader().feed(bytes([BATCH]) + too_big)
    with pytest.raises(FrameError):
        header(BATCH, MAX_FRAME + 1)
