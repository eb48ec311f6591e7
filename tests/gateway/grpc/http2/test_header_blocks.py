"""Request header blocks decoded once and then from the cache (services/gateway/grpc/http2/header_blocks.py)."""

from __future__ import annotations

import hpack
from hypothesis import given
from hypothesis import strategies as st

from services.gateway.grpc.http2.header_blocks import HeaderDecoder

GRPC_CALL = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b":authority", b"127.0.0.1:8001"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
    (b"user-agent", b"grpc-c++/1.66"),
]

fields = st.tuples(st.sampled_from([b"x-a", b"x-b", b"user-agent", b"grpc-timeout"]), st.sampled_from([b"1", b"22"]))


@given(st.lists(st.lists(fields, max_size=5), max_size=30), st.integers(64, 4096))
def test_every_block_decodes_to_what_the_encoder_sent(calls, table_size):
    """Whatever the blocks add to or evict from the table, cached or not, the fields are the sent ones."""
    encoder, decoder = hpack.Encoder(), HeaderDecoder()
    encoder.header_table_size = table_size  # small tables evict: references shift under the cache
    for extra in calls:
        sent = GRPC_CALL + extra
        assert decoder.decode(encoder.encode(sent)) == sent


def test_a_repeated_call_is_decoded_once():
    encoder, decoder = hpack.Encoder(), HeaderDecoder()
    first = encoder.encode(GRPC_CALL)
    second = encoder.encode(GRPC_CALL)
    assert first != second  # the first adds to the table, the next only refers to it
    assert decoder.decode(first) == decoder.decode(second) == GRPC_CALL
    assert decoder.decode(second) is decoder.decode(encoder.encode(GRPC_CALL))  # the cached result
