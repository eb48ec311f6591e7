"""The gateway's front doors under hostile input: its process, its ports, and the invariants every
fuzz case checks (docs/security.md, "Front doors").

No crash: the gateway process is the one that started and still runs (the cluster is started
unsupervised, so a crash is not hidden by a restart). No hang: every exchange answers or closes
within `CASE_S`. Bounded memory: the gateway's resident size, read from /proc.
"""

from __future__ import annotations

import http.client
import json
import resource
import socket
import time
from pathlib import Path

from onnx import TensorProto

from services.repository import examples
from tests.cluster import Running, identity_config

CASE_S = 10.0  # an answer, or the connection closed, within this (a loaded 2-core machine included)
FDS_WANTED = 8192  # a thousand idle connections on both ends of one machine, and the services' own


def raise_fd_limit() -> int:
    """The soft descriptor limit raised towards the hard one (the services inherit it); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FDS_WANTED if hard == resource.RLIM_INFINITY else min(FDS_WANTED, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        soft = wanted
    return soft


def fuzz_repository(root: Path) -> Path:
    """The example models (simple, identity_fp32, mlp) and a BYTES identity."""
    examples.write_examples(root)
    graph = examples.identity_graph(TensorProto.STRING, 2, "identity_bytes")
    examples.write_model(root, "identity_bytes", graph, identity_config("identity_bytes", "BYTES"))
    return root


class Hang(AssertionError):
    """The gateway neither answered nor closed within the deadline."""


class Doors:
    def __init__(self, running: Running) -> None:
        self.running = running

    def __repr__(self) -> str:  # hypothesis prints the fixtures of a failing example
        return f"Doors(gateway pid {self.pid}, http {self.http_port}, grpc {self.grpc_port})"

    @property
    def pid(self) -> int:
        process = self.running.cluster.child("gateway").process
        assert process is not None
        return process.pid

    @property
    def http_port(self) -> int:
        return self.running.cluster.gateway.http_port

    @property
    def grpc_port(self) -> int:
        return self.running.cluster.gateway.grpc_port

    def alive(self) -> None:
        process = self.running.cluster.child("gateway").process
        assert process is not None and process.poll() is None, f"the gateway exited with code {process.poll()}"

    def ready(self) -> None:
        """The gateway is up and answers `/v2/health/ready` with 200 within the case deadline."""
        self.alive()
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=CASE_S)
        try:
            conn.request("GET", "/v2/health/ready")
            status = conn.getresponse().status
        except TimeoutError:
            raise Hang("/v2/health/ready did not answer") from None
        finally:
            conn.close()
        assert status == 200, f"/v2/health/ready answered {status}"

    def rss_kib(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS for the gateway")


def exchange(port: int, data: bytes, deadline_s: float = CASE_S, half_close: bool = False) -> bytes:
    """Send `data` on a fresh connection and read until the server closes: every byte it answered.
    A server that neither closes nor stops sending within the deadline is a hang. `half_close`:
    the client says it sends no more (a server may then close without answering)."""
    ends = time.monotonic() + deadline_s
    with socket.create_connection(("127.0.0.1", port), timeout=deadline_s) as sock:
        try:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:  # it closed first (refused what it read so far): read what it said
            pass
        return read_until_closed(sock, ends)


def read_until_closed(sock: socket.socket, ends: float) -> bytes:
    out = bytearray()
    while True:
        left = ends - time.monotonic()
        if left <= 0:
            raise Hang(f"still open after the deadline, {len(out)} bytes read: {bytes(out[:200])!r}")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return bytes(out)
        if not chunk:
            return bytes(out)
        out += chunk


def responses(raw: bytes) -> list[tuple[int, bytes | None]]:
    """The (status, body) of each HTTP/1.1 response in `raw`, a connection's whole answer (body
    None: an answer to a HEAD, which has none)."""
    out = []
    at = 0
    while at < len(raw):
        head_end = raw.find(b"\r\n\r\n", at)
        assert head_end >= 0, f"an incomplete response head: {raw[at : at + 200]!r}"
        lines = raw[at:head_end].split(b"\r\n")
        assert lines[0].startswith(b"HTTP/1.1 "), f"not a status line: {lines[0][:200]!r}"
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        body = raw[head_end + 4 : head_end + 4 + length]
        if body.startswith(b"HTTP/1.") or (not body and head_end + 4 == len(raw)):
            out.append((status, None))  # the answer to a HEAD: its length, never its body
            at = head_end + 4
            continue
        assert len(body) == length, f"a response body cut short: {len(body)} of {length} bytes"
        if status != 100:
            out.append((status, body))
        at = head_end + 4 + length
    return out


TRITON_STATUSES = frozenset({200, 400, 403, 404, 405, 409, 431, 499, 500, 501, 503})
# what the HTTP parser answers, before any handler, to bytes that are not HTTP/1.1 (uvicorn's words)
PARSER_REFUSALS = frozenset({(400, b"Invalid HTTP request received.")})


def http_request(method: str, path: str, body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None) -> bytes:
    """One request that asks the server to close after answering (so `exchange` reads all of it)."""
    head = [f"{method} {path} HTTP/1.1".encode(), b"host: fuzz", f"content-length: {len(body)}".encode()]
    head += [name + b": " + value for name, value in headers or []]
    head.append(b"connection: close")
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def check_triton_answer(status: int, body: bytes | None) -> None:
    """A status Triton answers with and, for an error, Triton's `{"error": "<text>"}`; never the text
    of an unhandled exception (the front ends' last resort, `internal error: ...`: a bug)."""
    assert status in TRITON_STATUSES, f"status {status}: {body[:300]!r}"
    if status < 400 or body is None or (status, body) in PARSER_REFUSALS:
        return
    doc = json.loads(body.decode("utf-8", errors="surrogateescape"))  # a message may name bytes the client sent
    assert isinstance(doc, dict) and isinstance(doc.get("error"), str) and doc["error"], body[:300]
    assert not doc["error"].startswith("internal error"), doc["error"]


def one_answer(port: int, request: bytes) -> tuple[int, bytes]:
    """The one response to `request` (not a HEAD), checked to be Triton's."""
    answered = responses(exchange(port, request))
    assert len(answered) == 1, f"{len(answered)} responses to one request"
    status, body = answered[0]
    assert body is not None, "an answer without a body to a request that was not a HEAD"
    check_triton_answer(status, body)
    return status, body
