"""Slow and greedy clients (docs/security.md, "Front doors"): a thousand connections that are idle
or trickle their headers, and clients that never read their answers. The gateway keeps serving a
normal client (its p50 within 2x of its p50 without them) with bounded memory."""

from __future__ import annotations

import select
import socket
import statistics
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from services.gateway.grpc.http2 import frames as f
from tests.gateway.fuzz import h2_wire as h
from tests.gateway.fuzz.doors import CASE_S, Doors, http_request
from tests.gateway.fuzz.grpc_inputs import valid_simple

GATEWAY = {"http_header_timeout_s": 120.0, "http_max_input_size": 4 << 20}  # the slow ones stay while measured
CONNECTIONS = 1000
SAMPLES = 150
RSS_GROWTH_KIB = 96 * 1024


def p50_ms(client: httpclient.InferenceServerClient) -> float:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    took = []
    for _ in range(SAMPLES):
        started = time.perf_counter()
        client.infer("simple", inputs)
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


class Crowd:
    """Connections that hold the gateway: half idle, half trickling a request head a byte a second."""

    def __init__(self, port: int, count: int) -> None:
        self.socks = [socket.create_connection(("127.0.0.1", port), timeout=CASE_S) for _ in range(count)]
        self.slow = self.socks[: count // 2]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def _trickle(self) -> None:
        head = http_request("GET", "/v2/health/ready", b"", [(b"x-slow", b"a" * 4096)])
        at = 0
        while not self._stop.wait(1.0):
            for sock in self.slow:
                sock.send(head[at : at + 1])
            at = min(at + 1, len(head) - 5)  # never the end: the head stays incomplete

    def open(self) -> int:
        """How many are still open (nothing to read: no answer, no close)."""
        readable, _, _ = select.select(self.socks, [], [], 0)
        return len(self.socks) - len(readable)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(CASE_S)
        for sock in self.socks:
            sock.close()


@pytest.fixture(scope="module")
def client(doors: Doors) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(f"127.0.0.1:{doors.http_port}", network_timeout=CASE_S) as c:
        p50_ms(c)  # warm: the first requests pay for connections and caches
        yield c


def test_a_thousand_idle_and_slow_connections_leave_a_normal_clients_p50_within_2x(
    doors: Doors, client: httpclient.InferenceServerClient
) -> None:
    before = p50_ms(client)
    crowd = Crowd(doors.http_port, CONNECTIONS)
    try:
        during = p50_ms(client)
        still_open = crowd.open()
    finally:
        crowd.close()
    after = p50_ms(client)
    baseline = max(before, after)  # the slower of the two: a loaded machine's bursts fall on either side
    print(f"\np50 without: {before:.2f} / {after:.2f} ms, with {CONNECTIONS} idle+slow: {during:.2f} ms")
    assert still_open == CONNECTIONS, f"only {still_open} of the crowd were open while measured"
    assert during <= 2 * baseline, f"p50 {during:.2f} ms with the crowd, {baseline:.2f} ms without"
    doors.ready()


def test_a_client_that_never_reads_its_answers_holds_bounded_memory(
    doors: Doors, client: httpclient.InferenceServerClient
) -> None:
    """Pipelined requests for 512 KiB answers, none read: the gateway stops reading the client
    (one answer waits at a time) and goes on serving others."""
    rss = doors.rss_kib()
    values = np.zeros((1, 131072), dtype=np.float32).tobytes()
    header = (
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,131072],'
        b'"parameters":{"binary_data_size":%d}}],"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}'
        % len(values)
    )
    head = http_request(
        "POST",
        "/v2/models/identity_fp32/infer",
        header + values,
        [(b"inference-header-content-length", b"%d" % len(header))],
    )
    request = head.replace(b"connection: close\r\n", b"")
    sent = _send_until_stalled(doors.http_port, request, 400)
    assert sent < 400, "the gateway read 400 pipelined requests (200 MiB of answers) from a client that reads none"
    _served_meanwhile(doors, client)
    grown = doors.rss_kib() - rss
    assert grown < RSS_GROWTH_KIB, f"the gateway grew by {grown} KiB"


def test_a_grpc_client_that_never_reads_its_answers_holds_bounded_memory(
    doors: Doors, client: httpclient.InferenceServerClient
) -> None:
    """The same over HTTP/2, with the client's windows opened wide so that flow control does not
    stop the answers: the gateway stops reading once its send buffer is full. The calls come a few
    milliseconds apart (a client that sends all at once has them all read first: in flight, they
    are bounded by the streams a connection may open, docs/security.md)."""
    rss = doors.rss_kib()
    request = valid_simple()
    request.model_name = "identity_fp32"
    del request.inputs[1:]
    request.inputs[0].datatype, request.inputs[0].shape[:] = "FP32", [1, 131072]
    request.inputs[0].contents.Clear()
    request.raw_input_contents.append(bytes(4 * 131072))
    del request.outputs[:]
    message = request.SerializeToString()
    opening = h.preface((f.INITIAL_WINDOW_SIZE, 2**31 - 1)) + f.window_update(0, 2**31 - 1 - 65_535)
    calls = (h.call(2 * i + 1, message) for i in range(400))
    sent = _send_until_stalled(doors.grpc_port, opening, 400, calls, gap_s=0.01)
    assert sent < 400, "the gateway read 400 calls (200 MiB of answers) from a client that reads none"
    _served_meanwhile(doors, client)
    grown = doors.rss_kib() - rss
    assert grown < RSS_GROWTH_KIB, f"the gateway grew by {grown} KiB"


def _send_until_stalled(
    port: int, first: bytes, count: int, rest: Iterator[bytes] | None = None, gap_s: float = 0.0
) -> int:
    """Send `first` then up to `count` more messages (`first` again, or `rest`) on one connection
    that never reads; stop when sending stalls for 3 s. How many went."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=3.0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        sock.sendall(first)
        for sent in range(count):
            time.sleep(gap_s)  # a pace, not a wait for anything
            try:
                sock.sendall(next(rest) if rest is not None else first)
            except TimeoutError:
                return sent
        return count
    finally:
        sock.close()


def _served_meanwhile(doors: Doors, client: httpclient.InferenceServerClient) -> None:
    doors.ready()
    assert p50_ms(client) < CASE_S * 1000
