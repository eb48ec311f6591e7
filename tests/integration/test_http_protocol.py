"""Inference requests the HTTP protocol answers without ASGI (services/gateway/http/protocol.py)
behave on the wire as through uvicorn's ASGI cycle: pipelined requests answer in order,
`Expect: 100-continue` gets its interim response, `Connection: close` and HTTP/1.0 close."""

from __future__ import annotations

import json
import socket

from tests.integration.test_errors import good_body


def _exchange(url: str, data: bytes, responses: int) -> list[tuple[bytes, dict[str, str], bytes]]:
    """Send raw bytes, read `responses` HTTP responses (Content-Length bodies) off the connection."""
    host, port = url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(data)
        buffer, out = b"", []
        while len(out) < responses:
            while b"\r\n\r\n" not in buffer:
                chunk = sock.recv(65536)
                assert chunk, f"connection closed after {len(out)} response(s)"
                buffer += chunk
            head, buffer = buffer.split(b"\r\n\r\n", 1)
            status_line, *lines = head.split(b"\r\n")
            headers = {k.decode().lower(): v.decode() for k, v in (line.split(b": ", 1) for line in lines)}
            if status_line.startswith(b"HTTP/1.1 100"):
                out.append((status_line, headers, b""))
                continue
            size = int(headers["content-length"])
            while len(buffer) < size:
                chunk = sock.recv(65536)
                assert chunk, "connection closed inside a body"
                buffer += chunk
            out.append((status_line, headers, buffer[:size]))
            buffer = buffer[size:]
        return out


def _post(path: str, body: bytes, extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    head = b"POST " + path.encode() + b" HTTP/" + version + b"\r\nHost: x\r\nContent-Length: "
    return head + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body


def _sums(body: bytes) -> list[int]:
    outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
    return outputs["OUTPUT0"]


def test_pipelined_requests_answer_in_order(shoal):
    first = good_body()
    second = json.dumps(
        {"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": [5] * 16} for n in ("INPUT0", "INPUT1")]}
    ).encode()
    unknown = _post("/v2/models/no_such_model/infer", first)
    data = _post("/v2/models/simple/infer", first) + unknown + _post("/v2/models/simple/infer", second)
    answers = _exchange(shoal.url, data, 3)
    assert [a[0] for a in answers] == [b"HTTP/1.1 200 OK", b"HTTP/1.1 404 Not Found", b"HTTP/1.1 200 OK"]
    assert _sums(answers[0][2]) == [2 * i for i in range(16)] and _sums(answers[2][2]) == [10] * 16
    assert "unknown model" in json.loads(answers[1][2])["error"]


def test_expect_100_continue_gets_its_interim_response(shoal):
    answers = _exchange(shoal.url, _post("/v2/models/simple/infer", good_body(), b"Expect: 100-continue\r\n"), 2)
    assert answers[0][0] == b"HTTP/1.1 100 Continue" and answers[1][0] == b"HTTP/1.1 200 OK"


def test_connection_close_and_http_1_0_close_after_the_answer(shoal):
    for data in (
        _post("/v2/models/simple/infer", good_body(), b"Connection: close\r\n"),
        _post("/v2/models/simple/infer", good_body(), version=b"1.0"),
    ):
        host, port = shoal.url.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(data)
            received = b""
            while chunk := sock.recv(65536):  # the server closes: recv returns b"" instead of blocking
                received += chunk
        assert received.startswith(b"HTTP/1.1 200 OK") and b"\r\nconnection: close\r\n" in received
