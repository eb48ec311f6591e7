"""shared/holders.py against a real nats-server: a holder whose process is gone (no subscription
left) is noticed within about a second; a live one never is; unacknowledged requests go with a
dead scheduler's; and the reconnect logging of shared/bus.py stays quiet during an outage."""

from __future__ import annotations

import asyncio
import logging
import time

import nats
import pytest

from shared import bus
from shared.holders import Holders
from shared.natsserver import NatsServer


@pytest.fixture(scope="module")
def server():
    with NatsServer() as running:
        yield running


async def _scheduler(url: str, subject: str):
    nc = await nats.connect(url)

    async def alive(msg) -> None:
        await msg.respond(b"")

    await nc.subscribe(subject, cb=alive)
    return nc


async def _lost_within(holders: Holders, lost: list, seconds: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if lost:
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    return None


async def _watching(url: str) -> tuple[nats.NATS, Holders, list]:
    """A started `Holders` on its own connection, and the (holder, rids) it reports lost."""
    nc = await nats.connect(url)
    lost: list = []

    async def on_lost(holder: str, rids: list[str]) -> None:
        lost.append((holder, sorted(rids)))

    holders = Holders(nc, on_lost)
    holders.start()
    return nc, holders, lost


async def test_a_dead_holder_is_noticed_and_a_live_one_is_not(server):
    nc, holders, lost = await _watching(server.url)
    dead, live = await _scheduler(server.url, "alive.a"), await _scheduler(server.url, "alive.b")
    holders.held("alive.a", ["r1", "r2"])
    holders.held("alive.b", ["r3"])
    holders.sent(["r4"])  # never acknowledged: it may be in the dead scheduler's buffers
    await asyncio.sleep(1.2)  # r4 unacknowledged for longer than UNACKED_S
    await dead.close()  # its subscription goes with its connection, as with kill -9
    assert await _lost_within(holders, lost, 3) is not None
    assert lost == [("alive.a", ["r1", "r2", "r4"])]
    await asyncio.sleep(1.5)
    assert len(lost) == 1  # the live holder (r3) is never declared gone
    holders.done("r3")
    holders.stop()
    await live.close()
    await nc.close()


async def test_requests_sent_just_before_a_holder_died_are_recovered_too(server):
    nc, holders, lost = await _watching(server.url)
    dead = await _scheduler(server.url, "alive.c")
    holders.held("alive.c", ["r1"])
    holders.sent(["r2"])  # taken by the scheduler in the 0.1 s before it died: never acknowledged
    holders.sent(["r3"])
    await dead.close()
    holders.done("r3")  # answered after all: not recovered
    deadline = time.monotonic() + 6
    while len(lost) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert lost == [("alive.c", ["r1"]), ("alive.c", ["r2"])]
    holders.stop()
    await nc.close()


async def test_an_outage_logs_one_error(caplog):
    outage = bus._Outage("test")
    caplog.set_level(logging.DEBUG, logger="shared.bus")
    await outage.disconnected()
    for _ in range(20):  # nats-py calls error_cb on every reconnect attempt
        await outage.error(ConnectionRefusedError("Connection refused"))
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(errors) == 1 and len(warnings) == 1 and errors[0].exc_info is None
