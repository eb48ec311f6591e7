"""Hostile bytes on the HTTP/1.1 wire (docs/security.md, "Front doors"): request lines, headers
and framing that a hypothesis-driven raw-socket fuzzer makes up, heads too large or too slow,
bodies past the limit on the routes ASGI serves. Each case is answered or closed within the
deadline, with Triton's status and `{"error": ...}` where a handler answers; the gateway stays up."""

from __future__ import annotations

import socket
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.fuzz import http_wire as w
from tests.gateway.fuzz.doors import (
    CASE_S,
    Doors,
    check_triton_answer,
    exchange,
    http_request,
    read_until_closed,
    responses,
)
from tests.serving import wait_until

HEADER_TIMEOUT_S = 2.0
KEEPALIVE_S = 7.0  # past uvicorn's own 5 s, so that the test tells them apart
GATEWAY = {
    "http_header_timeout_s": HEADER_TIMEOUT_S,
    "http_max_header_size": 16 * 1024,
    "http_keepalive_timeout_s": KEEPALIVE_S,
}
CI = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@CI
@given(raw=w.raw_requests())
def test_made_up_requests_are_answered_or_closed(doors: Doors, raw: bytes) -> None:
    for status, body in responses(exchange(doors.http_port, raw, half_close=True)):
        check_triton_answer(status, body)
    doors.alive()


def test_a_head_past_the_limit_gets_431_and_the_connection_closes(doors: Doors) -> None:
    for headers in ([(b"x-big", b"a" * 20_000)], [(b"x-%d" % i, b"v") for i in range(3000)]):
        answered = responses(exchange(doors.http_port, http_request("GET", "/v2/health/ready", b"", headers)))
        assert [status for status, _ in answered] == [431]
    answered = responses(exchange(doors.http_port, http_request("GET", "/v2/" + "a" * 20_000)))
    assert [status for status, _ in answered] == [431]
    ok = responses(exchange(doors.http_port, http_request("GET", "/v2/health/ready", b"", [(b"x-fits", b"a" * 8000)])))
    assert [status for status, _ in ok] == [200]
    doors.ready()


def test_an_endless_header_is_cut_off_at_the_limit(doors: Doors) -> None:
    """Sent without end: the gateway answers 431 once it has the limit's worth, not at the end."""
    with socket.create_connection(("127.0.0.1", doors.http_port), timeout=CASE_S) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\nx-endless: ")
        ends = time.monotonic() + CASE_S
        sent = 0
        try:
            while time.monotonic() < ends and sent < 64 << 20:
                sock.sendall(b"a" * 65536)
                sent += 65536
        except OSError:  # refused and closed: what it said is still readable
            pass
        answered = responses(read_until_closed(sock, ends))
    assert sent < 64 << 20, "the gateway read 64 MiB of one header"
    assert [status for status, _ in answered] == [431]
    doors.ready()


def test_a_head_trickled_a_byte_at_a_time_is_cut_off_at_the_timeout(doors: Doors) -> None:
    head = http_request("GET", "/v2/health/ready", b"", [(b"x-slow", b"a" * 200)])
    with socket.create_connection(("127.0.0.1", doors.http_port), timeout=CASE_S) as sock:
        started = time.monotonic()
        closed = w.trickle(sock, head[:-4], every_s=0.05, until=started + HEADER_TIMEOUT_S + CASE_S)
        took = time.monotonic() - started
        answered = responses(read_until_closed(sock, time.monotonic() + CASE_S))
    assert closed, "the gateway still read the trickle past its header timeout"
    assert HEADER_TIMEOUT_S - 0.5 < took < HEADER_TIMEOUT_S + CASE_S
    assert [status for status, _ in answered] == [408]
    doors.ready()


def test_a_connection_that_sends_nothing_is_closed_at_the_timeout(doors: Doors) -> None:
    with socket.create_connection(("127.0.0.1", doors.http_port), timeout=CASE_S) as sock:
        started = time.monotonic()
        answered = responses(read_until_closed(sock, started + HEADER_TIMEOUT_S + CASE_S))
        assert time.monotonic() - started > HEADER_TIMEOUT_S - 0.5
    assert [status for status, _ in answered] == [408]


def test_an_idle_keep_alive_connection_waits_its_timeout_for_the_next_request(doors: Doors) -> None:
    """Idle for less than `--http-keepalive-timeout-s` (here 7 s; 75 by default), the connection
    still serves; idle past it, the server closes it (uvicorn's own 5 s raced pooled clients).
    The second request comes after 5.5 s idle: past uvicorn's default, within ours."""
    ask = b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", doors.http_port), timeout=CASE_S) as sock:
        for idle_s in (0.0, KEEPALIVE_S - 1.5):
            time.sleep(idle_s)  # the idleness under test, not a wait for something to happen
            sock.sendall(ask)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        idle_from = time.monotonic()
        assert read_until_closed(sock, idle_from + KEEPALIVE_S + CASE_S) == b""
        assert time.monotonic() - idle_from > KEEPALIVE_S - 0.5


def test_a_control_api_body_past_the_limit_is_refused_with_tritons_text(doors: Doors) -> None:
    limit = doors.running.cluster.gateway.http_max_input_size
    for path in ("/v2/repository/index", "/v2/systemsharedmemory/region/r/register", "/v2/models/simple/generate"):
        status, body = responses(exchange(doors.http_port, http_request("POST", path, b" " * (limit + 1))))[0]
        assert status == 400, (path, status, body)
        expected = f"request JSON size of {limit + 1} bytes exceeds the maximum allowed input size of {limit} bytes"
        assert expected in body.decode(), body
    doors.ready()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(1, 400))
def test_a_request_cut_short_is_closed_with_the_client(doors: Doors, cut: int) -> None:
    body = b'{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [' + b"1," * 100
    raw = http_request("POST", "/v2/models/simple/infer", body)
    exchange(doors.http_port, raw[: min(cut, len(raw) - 1)], half_close=True)
    doors.alive()


def test_still_ready_after_the_cases(doors: Doors) -> None:
    wait_until(lambda: doors.ready() is None, CASE_S, "the gateway ready", errors=(AssertionError, OSError))
