"""A service's life on the bus (shared/process/runtime.py `serve_until`): started, then stopped on
the stop signal, also while its start still waits on another service (a real nats-server)."""

from __future__ import annotations

import asyncio

from shared.bus import buckets, connection
from shared.process.natsserver import NatsServer
from shared.process.runtime import serve_until
from tests.serving import until


class WaitsForABucket:
    """A service whose start waits for a bucket no service makes, as a gateway or worker waits for
    the models bucket of a repository that failed at start."""

    def __init__(self, nc) -> None:
        self.nc = nc
        self.waiting = False
        self.started = False
        self.stopped = False

    async def start(self) -> None:
        self.waiting = True
        await buckets.bucket(self.nc, "made_by_no_one", create=False)  # a minute of waiting
        self.started = True

    async def stop(self) -> None:
        self.stopped = True


class StartsAtOnce(WaitsForABucket):
    async def start(self) -> None:
        self.started = True


async def _serving(url: str, kind: type[WaitsForABucket]) -> tuple[WaitsForABucket, asyncio.Event, asyncio.Task]:
    """A service of `kind` on its own connection, served until the event returned is set."""
    nc = await connection.connect(url, "test-runtime")
    stop = asyncio.Event()
    service = kind(nc)
    return service, stop, asyncio.create_task(serve_until(stop, nc, service, "test"))


async def test_a_stop_while_starting_ends_the_start_at_once(nats_server: NatsServer) -> None:
    service, stop, serving = await _serving(nats_server.url, WaitsForABucket)
    await until(lambda: service.waiting, 30, "the start waiting")
    stop.set()
    # the bucket wait alone is a minute: 20 s is what a loaded machine may need, not the wait's end
    await asyncio.wait_for(serving, 20)
    assert not service.started
    assert service.stopped  # what the start began is stopped
    assert service.nc.is_closed or service.nc.is_draining


async def test_a_started_service_serves_until_the_stop(nats_server: NatsServer) -> None:
    service, stop, serving = await _serving(nats_server.url, StartsAtOnce)
    await until(lambda: service.started, 30, "the start")
    assert not serving.done() and not service.stopped
    stop.set()
    await asyncio.wait_for(serving, 20)
    assert service.stopped


async def test_a_stop_while_the_bus_is_away_closes_the_connection_without_an_error() -> None:
    """`docker compose restart` stops a gateway's NATS node before the gateway: its drain then
    raised ConnectionReconnectingError, a CRITICAL traceback and a failed exit."""
    with NatsServer() as server:
        service, stop, serving = await _serving(server.url, StartsAtOnce)
        await until(lambda: service.started, 30, "the start")
        server.kill()
        await until(lambda: service.nc.is_reconnecting, 30, "the connection reconnecting")
        stop.set()
        await asyncio.wait_for(serving, 20)  # no ConnectionReconnectingError
        assert service.stopped and service.nc.is_closed
