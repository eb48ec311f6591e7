"""The HTTP protocol's one way in for claimed requests (services/gateway/http/protocol.py): it
reads their body (up to the app's limit), sends `100 Continue` when asked, cancels the handler of
a client that goes away, and the restriction wrapper guards what it claims. Served by a real
uvicorn on a real socket (`services.gateway.listeners`), in-process, with an app of the protocol's
own interface in place of inference."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest
import uvicorn

from services.gateway.http.protocol import CorkedHttpToolsProtocol, Disconnect
from services.gateway.http.restricted import RestrictedAPI, Restriction
from services.gateway.listeners import Listeners

LIMIT = 1000
DEADLINE_S = 30  # generous on a loaded machine; each wait ends as soon as its condition holds


class Claiming:
    """Claims `POST /claimed`; answers the rest through ASGI. Holds a request that sends `x-hold`
    until its client goes away."""

    limit = LIMIT

    def __init__(self) -> None:
        self.bodies: list[tuple[bytes, int]] = []
        self.held = asyncio.Event()
        self.cancelled: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def claim(self, method: str, path: str) -> tuple[str, str] | None:
        return ("model", "") if method == "POST" and path == "/claimed" else None

    async def respond(
        self,
        claim: tuple[str, str],
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
        size: int,
        disconnect: Disconnect,
    ) -> tuple[int, bytes, dict[str, str]]:
        self.bodies.append((body, size))
        if b"x-hold" in dict(headers):
            disconnect.watch(asyncio.current_task())
            self.held.set()
            try:
                await asyncio.Event().wait()  # until cancelled
            except asyncio.CancelledError:
                self.cancelled.set_result(disconnect.gone)
                raise
        return 200, f"{len(body)} of {size}".encode(), {"content-type": "text/plain"}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"asgi"})


async def serving(app: Any) -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    listeners = Listeners(exit_timeout_s=1)
    # no proxy headers: their middleware would wrap the app, and only the app itself claims (as the gateway)
    config = uvicorn.Config(
        app, http=CorkedHttpToolsProtocol, proxy_headers=False, log_level="warning", access_log=False
    )
    config.timeout_graceful_shutdown = 1
    await listeners.serve(config, [sock])
    try:
        yield sock.getsockname()[1]
    finally:
        await listeners.stop()


@pytest.fixture
async def app() -> Claiming:
    return Claiming()


@pytest.fixture
async def port(app: Claiming) -> AsyncIterator[int]:
    async for p in serving(app):
        yield p


def head(path: str, length: int, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The status line and body of one response (Content-Length framed)."""
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
    status, *lines = raw.split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:"))
    return status, await asyncio.wait_for(reader.readexactly(length), DEADLINE_S)


async def exchange(port: int, data: bytes) -> tuple[bytes, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        return await answer(reader)
    finally:
        writer.close()


async def test_a_claimed_body_is_read_whole_and_others_go_through_asgi(app: Claiming, port: int) -> None:
    body = b"x" * 600
    assert await exchange(port, head("/claimed", len(body)) + body) == (b"HTTP/1.1 200 OK", b"600 of 600")
    assert await exchange(port, head("/other", len(body)) + body) == (b"HTTP/1.1 200 OK", b"asgi")
    assert app.bodies == [(body, 600)]


async def test_an_oversize_body_is_counted_not_kept(app: Claiming, port: int) -> None:
    body = b"x" * (2 * LIMIT)
    status, content = await exchange(port, head("/claimed", len(body)) + body)
    kept, size = content.split(b" of ")
    assert status == b"HTTP/1.1 200 OK" and int(kept) <= LIMIT and int(size) == 2 * LIMIT


async def test_a_far_oversize_body_is_answered_before_it_ends(app: Claiming, port: int) -> None:
    """Past 4x the limit the handler answers at once (the size error), while the body still comes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head("/claimed", 100 * LIMIT) + b"x" * (5 * LIMIT))  # a fifth of what it declares
        status, content = await answer(reader)
    finally:
        writer.close()
    assert status == b"HTTP/1.1 200 OK"
    kept, size = content.split(b" of ")
    assert int(kept) <= LIMIT and 4 * LIMIT < int(size) < 100 * LIMIT


async def test_expect_100_continue_is_answered_before_the_body_is_sent(app: Claiming, port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head("/claimed", 3, "Expect: 100-continue"))  # and waits, as curl does
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"abc")
        assert await answer(reader) == (b"HTTP/1.1 200 OK", b"3 of 3")
    finally:
        writer.close()


async def test_a_client_that_goes_away_cancels_its_handler(app: Claiming, port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head("/claimed", 2, "x-hold: 1") + b"ab")
    await asyncio.wait_for(app.held.wait(), DEADLINE_S)
    writer.close()
    assert await asyncio.wait_for(app.cancelled, DEADLINE_S) is True  # cancelled because the client is gone


async def test_a_restricted_claim_needs_its_header() -> None:
    claiming = Claiming()
    restricted = RestrictedAPI(claiming, {"inference": Restriction("x-key", "secret")})
    async for port in serving(restricted):
        status, content = await exchange(port, head("/claimed", 2) + b"ab")
        assert (status, content) == (
            b"HTTP/1.1 403 Forbidden",
            b'{"error":"This API is restricted, expecting header \'x-key\'"}',
        )
        assert await exchange(port, head("/claimed", 2, "X-Key: secret") + b"ab") == (b"HTTP/1.1 200 OK", b"2 of 2")
        assert await exchange(port, head("/other", 2) + b"ab") == (b"HTTP/1.1 200 OK", b"asgi")  # not restricted
    assert claiming.bodies == [(b"ab", 2)]
