"""A scheduler's ask for the workers' holdings (services/scheduler/holdings.py) against a real
nats-server: NATS's "no responders" answer (no worker connected, as during a restart) is not a
malformed message."""

from __future__ import annotations

import logging
import time
from collections.abc import Coroutine
from typing import Any

import msgspec
import nats

from services.scheduler.holdings import Holdings
from shared.bus import connection
from shared.wire import subjects
from shared.wire.messages import WorkerHoldings
from tests.serving import until


class Recorded:
    """In the place of the scheduler's Tasks (compiled, so not subclassed): the reconciliations the
    holdings start, recorded instead of run (they need credits)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.started.append(coro.cr_code.co_name)
        coro.close()


async def test_no_responders_is_told_apart_from_a_reply(nats_server) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        got: list[Any] = []

        async def keep(msg: Any) -> None:
            got.append(msg)

        inbox = nc.new_inbox()
        await nc.subscribe(inbox, cb=keep)

        async def answer(msg: Any) -> None:
            await msg.respond(b"yes")

        await nc.subscribe("answered", cb=answer)
        await nc.publish("nobody.listens", b"", reply=inbox)
        await nc.publish("answered", b"", reply=inbox)
        await until(lambda: len(got) == 2, what="both answers")
        assert [connection.no_responders(msg) for msg in got] == [True, False]
    finally:
        await nc.close()


async def test_an_ask_nobody_answers_logs_nothing_and_starts_nothing(nats_server, caplog) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        tasks = Recorded()
        holdings = Holdings(nc, flights=None, credits=None, tasks=tasks)  # type: ignore[arg-type]
        await holdings.start()
        with caplog.at_level(logging.ERROR, logger="shoal.scheduler"):
            await holdings.ask()  # no worker: NATS answers 503 on the ask's inbox
            # a worker's answer after it, on the same subscription: once it is handled, so was the 503
            await nc.publish(f"{holdings.inbox}.0", msgspec.msgpack.encode(WorkerHoldings("w", [])))
            await until(lambda: tasks.started == ["_reconcile"], what="the worker's answer handled")
        assert [r.getMessage() for r in caplog.records] == []
    finally:
        await nc.close()


async def test_a_reconnected_scheduler_asks_again_while_the_interest_settles(nats_server) -> None:
    """A worker that reconnected to another node at the same moment may miss the first ask (its new
    subscription had not reached ours): the scheduler asks again, once per settle delay."""
    nc = await nats.connect(nats_server.url)
    try:
        asked: list[float] = []

        async def ask(msg: Any) -> None:
            asked.append(time.monotonic())

        await nc.subscribe(subjects.HOLDINGS_ASK, cb=ask)
        holdings = Holdings(nc, flights=None, credits=None, tasks=Recorded())  # type: ignore[arg-type]
        await holdings.start()
        started = time.monotonic()
        await holdings.ask_again_after_reconnect()
        await until(lambda: len(asked) == len(connection.RECONNECT_SETTLE_S), what="every ask received")
        assert [round(t - started, 1) >= d for t, d in zip(asked, connection.RECONNECT_SETTLE_S)] == [True, True]
    finally:
        await nc.close()
