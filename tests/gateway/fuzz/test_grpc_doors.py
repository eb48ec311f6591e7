"""Hostile input at the gRPC front door (docs/security.md, "Front doors"): `ModelInfer` messages
that are not what they claim (raw bytes through grpcio's generic unary call), and raw HTTP/2
sessions of odd frames: broken prefaces, frames of any type, flags and stream, settings out of
range, calls mixed in. Every call ends with a status within the deadline, a broken session is
closed, and the gateway stays up, ready, and bounded in memory."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings

from tests.gateway.fuzz import grpc_inputs as g
from tests.gateway.fuzz import h2_wire as h
from tests.gateway.fuzz.doors import CASE_S, Doors

CI = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
RSS_GROWTH_KIB = 64 * 1024
# what Triton answers a call with; UNKNOWN is Shoal's last resort for a bug ("Unexpected <class ...>")
CALL_STATUSES = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@pytest.fixture(scope="module")
def baseline(doors: Doors) -> int:
    doors.ready()
    return doors.rss_kib()


@pytest.fixture(scope="module")
def infer(doors: Doors) -> Iterator[grpc.UnaryUnaryMultiCallable]:
    with grpc.insecure_channel(f"127.0.0.1:{doors.grpc_port}") as channel:
        yield channel.unary_unary(h.INFER.decode())  # bytes in, bytes out: no (de)serializer


@CI
@given(message=g.infer_messages())
def test_infer_messages_end_with_a_tritons_status(
    doors: Doors, baseline: int, infer: grpc.UnaryUnaryMultiCallable, message: bytes
) -> None:
    try:
        infer(message, timeout=CASE_S)
    except grpc.RpcError as error:
        assert error.code() in CALL_STATUSES, (error.code(), error.details())
    doors.alive()


@CI
@given(data=h.sessions())
def test_raw_http2_sessions_are_answered_and_closed(doors: Doors, baseline: int, data: bytes) -> None:
    h.session(doors.grpc_port, data, CASE_S)  # raises Hang if the gateway holds it open
    doors.alive()


def test_still_ready_and_bounded_after_the_cases(
    doors: Doors, baseline: int, infer: grpc.UnaryUnaryMultiCallable
) -> None:
    doors.ready()
    answer = infer(g.valid_simple().SerializeToString(), timeout=CASE_S)
    assert answer, "a valid call after the fuzz got no answer"
    grown = doors.rss_kib() - baseline
    assert grown < RSS_GROWTH_KIB, f"the gateway grew by {grown} KiB over the module's cases"
