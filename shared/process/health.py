"""A health port for the services that have no HTTP endpoint of their own (scheduler, worker,
repository): Triton's two paths, for an orchestrator's probes (deploy/kubernetes/, docs/kubernetes.md).

- `GET /v2/health/live`: 200 while this process's event loop answers (the answer is written by the
  loop the service runs on, so a loop stuck in a blocking call fails it).
- `GET /v2/health/ready`: 200 once the service has started and while its NATS connection is up and
  it is not stopping; 503 otherwise (a stopping service says so at once, before it drains).

Off unless `--health-port` is given (0, the default): `shoal serve` and compose need none. Nothing
but those two paths is served; a request has 2 s to arrive whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

LIVE = "/v2/health/live"
READY = "/v2/health/ready"


class HealthPort:
    """Answers the two health paths on `port` from what `ready()` says at the moment of asking."""

    def __init__(self, port: int, ready: Callable[[], bool], address: str = "0.0.0.0") -> None:
        self.port = port
        self.address = address
        self.ready = ready
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._answer, self.address, self.port)
        sockets = self._server.sockets
        if sockets and self.port == 0:  # tests ask for any free port
            self.port = sockets[0].getsockname()[1]
        log.info("health endpoint on %s:%d (%s, %s)", self.address, self.port, LIVE, READY)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)
            self._server = None

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
            parts = head.split(b"\r\n", 1)[0].split()
            method, path = (parts[0], parts[1].decode("latin-1")) if len(parts) >= 2 else (b"", "")
            path = path.split("?", 1)[0]
            if method not in (b"GET", b"HEAD"):
                status = "405 Method Not Allowed"
            elif path == LIVE:
                status = "200 OK"
            elif path == READY:
                status = "200 OK" if self.ready() else "503 Service Unavailable"
            else:
                status = "404 Not Found"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
