"""The gateway's listening front ends, started and stopped as one: its uvicorn servers (HTTP,
metrics, OpenAI) and its gRPC listener.

Each uvicorn server runs in a task of its own on the gateway's event loop; `serve` returns once
its socket listens. A server that cannot bind raises `SystemExit` (uvicorn's answer), which ends
the process at once with the reason (`shared.process.runtime.fail`). `stop` gives the requests in flight
the exit timeout to finish, on every listener at the same time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
from collections.abc import Iterator

import uvicorn

from services.gateway.grpc.startup import Listener as GrpcListener
from shared.process.runtime import fail

log = logging.getLogger("shoal.gateway")


def raise_descriptor_limit() -> int:
    """Every client connection is a descriptor: the soft limit goes up to the hard one (a soft 1,024,
    still common, ends accepting at about a thousand connections; docs/security.md). The limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # a hard limit the kernel will not grant (above nr_open): keep ours
            log.warning("could not raise the descriptor limit from %d to %d", soft, hard)
    return soft


class _Server(uvicorn.Server):
    """Signals belong to the process (`shared.process.runtime`), not to each listener."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.listening.set()


class Listeners:
    def __init__(self, exit_timeout_s: float) -> None:
        self.exit_timeout_s = exit_timeout_s
        self._servers: dict[_Server, asyncio.Task[None]] = {}
        self._grpc: GrpcListener | None = None
        self._stopping = False

    async def serve(self, config: uvicorn.Config, sockets: list[socket.socket] | None = None) -> None:
        """Serve `config` (on `sockets`, else on its own host and port) from now until `stop`."""
        server = _Server(config)
        task = asyncio.create_task(server.serve(sockets))
        self._servers[server] = task
        listening = asyncio.ensure_future(server.listening.wait())
        try:
            await asyncio.wait((task, listening), return_when=asyncio.FIRST_COMPLETED)
        finally:
            listening.cancel()
        if not server.listening.is_set():  # ended while starting: its error says why
            task.result()
            raise RuntimeError(f"the listener on {config.host}:{config.port} ended while starting")
        task.add_done_callback(self._ended)

    def add_grpc(self, listener: GrpcListener) -> None:
        self._grpc = listener

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A listener that ends before `stop` takes the process down, as any service that fails."""
        if self._stopping or task.cancelled() or task.exception() is None:
            return
        log.critical("a listener failed", exc_info=task.exception())
        fail("gateway")

    async def stop(self) -> None:
        """Stop accepting, let the requests in flight finish (up to the exit timeout), then return."""
        self._stopping = True
        for server in self._servers:
            server.should_exit = True  # uvicorn's own graceful shutdown (timeout_graceful_shutdown)
        if self._grpc is not None:
            await self._grpc.stop(self.exit_timeout_s)  # in-flight calls may finish, meanwhile HTTP's do too
        await asyncio.gather(*self._servers.values(), return_exceptions=True)
