"""Batches lost with a NATS connection, found by asking workers which batches they hold.

When a connection drops (a worker's or this scheduler's: its NATS node died), a batch on its way
to the worker, or its completion on its way back, may be lost inside the dead node. Nothing
answers for it then, and it kept its credit until `credits.FLIGHT_GRACE_S` past its requests'
deadline. So a worker that reconnects publishes the batch ids it holds (`WorkerHoldings`), and a
scheduler that reconnects asks every worker for theirs. A batch sent to a worker more than
`IN_TRANSIT_S` before its holdings and not held there was lost: it ends (`Credits.lost_in_transit`:
safe requests run again, the others fail with a 503, the credit returns).

Batches sent within `IN_TRANSIT_S` of the holdings and not in them may still be on their way,
or lost: a worker whose node alone died reconnects within milliseconds, so the last batches sent
before the loss are always in that window. This scheduler asks again once they would have
arrived, and the second answer settles them like the first. The answers to an ask come to this
scheduler alone (its reply inbox), and an answer to a second ask never asks again: a round ends
after two answers, whatever the traffic and however many schedulers there are. Before, answers
went to every scheduler, so a second ask was allowed once per worker per 5 s (or the schedulers
would ask each other's answers again for ever), and a node lost twice within those 5 s left its
batches to their requests' deadline (issue 37).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from services.scheduler.batching.credits import Credits
from services.scheduler.batching.flights import Flights
from services.scheduler.tasks import Tasks
from shared.bus import connection
from shared.wire import subjects
from shared.wire.messages import WorkerHoldings

log = logging.getLogger("shoal.scheduler")

_decoder = msgspec.msgpack.Decoder(WorkerHoldings)
SETTLE_S = 0.25  # completions that arrived with the holdings are applied first
IN_TRANSIT_S = 0.5  # a batch sent this shortly before the holdings may not be in them yet


class Holdings:
    def __init__(self, nc: NATS, flights: Flights, credits: Credits, tasks: Tasks) -> None:
        self.nc = nc
        self.flights = flights
        self.credits = credits
        self.tasks = tasks
        self.inbox = nc.new_inbox()
        self._asks = itertools.count()
        self._second: deque[str] = deque(maxlen=64)  # the latest second asks: their answers never ask again

    async def start(self) -> None:
        await self.nc.subscribe(subjects.WORKER_HOLDINGS, cb=self._on_holdings)  # a worker reconnected
        await self.nc.subscribe(f"{self.inbox}.*", cb=self._on_holdings)  # answers to our asks

    async def ask(self, second: bool = False) -> None:
        """Every worker answers this scheduler with what it holds."""
        token = str(next(self._asks))
        if second:
            self._second.append(token)
        await self.nc.publish(subjects.HOLDINGS_ASK, b"", reply=f"{self.inbox}.{token}")

    async def ask_again_after_reconnect(self) -> None:
        """Asks again while the cluster's interest settles: a worker that reconnected to another
        node at the same moment may not have heard the first ask, nor we its holdings, and a batch
        sent to it before its new subscription reached our node was dropped (connection.py)."""
        waited = 0.0
        for delay in connection.RECONNECT_SETTLE_S:
            await asyncio.sleep(delay - waited)
            waited = delay
            await self.ask()

    async def _on_holdings(self, msg: Msg) -> None:
        if connection.no_responders(msg):  # no worker is connected now (e.g. during a NATS restart):
            return  # each one sends its holdings when it reconnects
        holdings: WorkerHoldings | None = connection.decode(_decoder, msg, log)
        if holdings is None:
            return
        token = msg.subject.rsplit(".", 1)[1] if msg.subject.startswith(self.inbox) else ""
        self.tasks.spawn(self._reconcile(holdings, time.monotonic(), token in self._second))

    async def _reconcile(self, holdings: WorkerHoldings, received: float, second: bool) -> None:
        await asyncio.sleep(SETTLE_S)
        worker, held = holdings.worker, set(holdings.batch_ids)
        await self.credits.lost_in_transit(worker, held, received - IN_TRANSIT_S)
        if second:
            return
        if any(key[1] not in held for key in self.flights.sent_before(worker, received)):
            await asyncio.sleep(IN_TRANSIT_S)  # by then they are there, or lost
            await self.ask(second=True)
