"""A TCP proxy between a service and nats-server that a test can use to lose messages for real.

`blackhole()` drops every byte the server sends to the clients connected now (what was published
to them is lost, while what they send still arrives); `sever()` then closes the clients' side of
those connections and keeps the server's side open, so the client reconnects (through the proxy,
to a connection that works) while the server has not noticed anything yet: the state right after
a cut link, before any ping has timed out. New connections are forwarded normally.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class _Pair:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    blackholed: bool = False


class Proxy:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.target_port = target_port
        self.host = host
        self.port = 0
        self._pairs: list[_Pair] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="proxy", daemon=True)
        self._server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self) -> Proxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        server_reader, server = await asyncio.open_connection(self.host, self.target_port)
        pair = _Pair(client, server)
        self._pairs.append(pair)
        await asyncio.gather(self._upstream(client_reader, pair), self._downstream(server_reader, pair))

    @staticmethod
    async def _upstream(reader: asyncio.StreamReader, pair: _Pair) -> None:
        """Client -> server; a client that goes away leaves the server's side open (see `sever`)."""
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                pair.server.write(data)
                await pair.server.drain()

    @staticmethod
    async def _downstream(reader: asyncio.StreamReader, pair: _Pair) -> None:
        """Server -> client, or nowhere while black-holed (still read: the server never blocks)."""
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if pair.blackholed or pair.client.is_closing():
                    continue
                pair.client.write(data)
                with contextlib.suppress(ConnectionError):
                    await pair.client.drain()

    def _run(self, fn: object) -> None:
        async def call() -> None:
            fn()  # type: ignore[operator]

        asyncio.run_coroutine_threadsafe(call(), self._loop).result(10)

    def blackhole(self) -> None:
        def drop() -> None:
            for pair in self._pairs:
                pair.blackholed = True

        self._run(drop)

    def sever(self) -> None:
        def cut() -> None:
            for pair in self._pairs:
                if pair.blackholed:
                    pair.client.transport.abort()

        self._run(cut)

    def stop(self) -> None:
        """Close every connection and end the proxy's tasks before its loop ends: a task left
        pending when the loop is dropped is an unraisable error in whatever test runs next."""
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pair in self._pairs:
            pair.client.transport.abort()
            pair.server.transport.abort()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


@contextlib.contextmanager
def proxy_to(port: int) -> Iterator[Proxy]:
    proxy = Proxy(port).start()
    try:
        yield proxy
    finally:
        proxy.stop()
