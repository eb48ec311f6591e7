"""Which scheduler holds each request a dispatcher sent, and noticing when one dies.

A scheduler acknowledges the request groups it takes: a `HeldGroups` message on the
dispatcher's inbox, with a header naming its liveness subject, that lists the groups taken in
the last 0.1 s (services/scheduler/acknowledgements.py; the first group from an inbox at once).
While requests are held, the dispatcher asks each holder "are you there?" every `PING_S`: a
scheduler process that died has no subscription left, so NATS answers "no responders" at once
and its requests are handed to `on_lost` (re-sent or failed) within about a second instead of
waiting for their deadlines. A holder that is merely busy (the ping times out) or a bus that is
down proves nothing: no action.

A scheduler that dies after it received a group but before it acknowledged it (SIGKILLed
within those 0.1 s, or with the group still in its buffers) never says so. Requests not
acknowledged within `UNACKED_S` make the dispatcher ping every scheduler it has heard from; if
one of them is gone, those requests may have been its, and go to `on_lost` with its own. The
requests still unacknowledged when a scheduler is found dead, but younger than `UNACKED_S`, go
to `on_lost` too once they are that old and still unacknowledged.

A scheduler whose own connection to NATS dropped and came back (its node died: it reconnects to
another one within milliseconds) is alive, so the pings above never find it gone; but the groups
on their way to it when its node died were lost inside that node, and it never acknowledges them.
It says so once reconnected (`SCHEDULER_RECONNECTED`, after the acknowledgements it owed:
`reconnected`), and the requests unacknowledged at that moment go to `on_lost` (with
`dead=False`: what it holds stays with it) if they are still unacknowledged `UNACKED_S` after
they were sent. Before, they waited for their deadlines (issue 37). Requests sent in the
`connection.RECONNECT_SETTLE_S` after that notice are looked at the same way: until this node hears
of the scheduler's new subscription, its node may still route them to the dead one (or drop them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from shared.bus import connection

log = logging.getLogger("shoal.gateway")

PING_S = 0.5  # how often a holder of requests is asked whether it lives
PING_TIMEOUT_S = 1.0
MIN_AGE_S = 0.3  # requests held for less than this are usually answered before a ping matters
UNACKED_S = 1.0  # a group no scheduler acknowledged for this long: some scheduler may have died with it

# (holder, rids, dead): dead, the holder's process is gone with what it held; not dead, its connection
# was lost and is back, and only these unacknowledged requests may have been lost with it
LostCallback = Callable[[str, list[str], bool], Awaitable[None]]


class Holders:
    def __init__(self, nc: NATS, on_lost: LostCallback) -> None:
        self.nc = nc
        self.on_lost = on_lost
        self._held: dict[str, dict[str, float]] = {}  # liveness subject -> rid -> when acknowledged
        self._by_rid: dict[str, str] = {}
        self._unacked: dict[str, float] = {}  # rid -> when sent, until a scheduler acknowledges it
        self._known: set[str] = set()  # liveness subjects of the schedulers heard from
        # requests unacknowledged when a scheduler was found dead (perhaps its, taken in the 0.1 s before
        # it died) or said it reconnected (perhaps lost in its dead node): lost if still unacknowledged
        # once UNACKED_S old (rid -> (that scheduler, whether it died))
        self._unacked_at_death: dict[str, tuple[str, bool]] = {}
        self._task: asyncio.Task[None] | None = None
        # the scheduler that said it reconnected, and until when requests sent to any are suspect
        self._settling: tuple[str, float] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def sent(self, rids: list[str]) -> None:
        now = time.monotonic()
        for rid in rids:
            self._unacked[rid] = now
        settling = self._settling
        if settling is not None:
            if now < settling[1]:
                for rid in rids:
                    self._unacked_at_death.setdefault(rid, (settling[0], False))
            else:
                self._settling = None

    def held(self, holder: str, rids: list[str]) -> None:
        now = time.monotonic()
        self._known.add(holder)
        requests = self._held.setdefault(holder, {})
        for rid in rids:
            self._unacked.pop(rid, None)
            requests[rid] = now
            self._by_rid[rid] = holder

    def done(self, rid: str) -> None:
        self._unacked.pop(rid, None)
        holder = self._by_rid.pop(rid, None)
        if holder is not None:
            requests = self._held.get(holder)
            if requests is not None:
                requests.pop(rid, None)
                if not requests:
                    del self._held[holder]

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(PING_S)
            now = time.monotonic()
            await self._orphans_of_the_dead(now)
            suspects = {h for h, rids in self._held.items() if rids and min(rids.values()) < now - MIN_AGE_S}
            orphans = [rid for rid, sent in self._unacked.items() if sent < now - UNACKED_S]
            if orphans:
                suspects |= self._known
            if not suspects:
                continue
            candidates = sorted(suspects)
            gone = await asyncio.gather(*(self._gone(h) for h in candidates))
            for holder, dead in zip(candidates, gone):
                if dead:
                    self._known.discard(holder)
                    await self._lost(holder, orphans)
                    orphans = []
                    for rid in self._unacked:  # younger than UNACKED_S: looked at again on later rounds
                        self._unacked_at_death.setdefault(rid, (holder, True))

    def reconnected(self, holder: str) -> None:
        """The scheduler answering `holder` lost its NATS connection and is back: what it did not
        acknowledge by now may have been lost with its node (recovered once `UNACKED_S` old), and so
        may what is sent while the cluster's interest settles."""
        for rid in self._unacked:
            self._unacked_at_death.setdefault(rid, (holder, False))
        self._settling = (holder, time.monotonic() + connection.RECONNECT_SETTLE_S[-1])

    async def _orphans_of_the_dead(self, now: float) -> None:
        """Requests unacknowledged when a scheduler died: acknowledged since, answered, or lost now."""
        lost: dict[tuple[str, bool], list[str]] = {}
        for rid, why in list(self._unacked_at_death.items()):
            sent = self._unacked.get(rid)
            if sent is None:
                del self._unacked_at_death[rid]
            elif sent < now - UNACKED_S:
                del self._unacked_at_death[rid]
                lost.setdefault(why, []).append(rid)
        for (holder, dead), rids in lost.items():
            if dead:
                await self._lost(holder, rids)
                continue
            for rid in rids:
                self._unacked.pop(rid, None)
            log.warning(
                "%d request(s) sent as %s lost its NATS connection were never taken; recovering them", len(rids), holder
            )
            await self.on_lost(holder, rids, False)

    async def _gone(self, holder: str) -> bool:
        try:
            await self.nc.request(holder, b"", timeout=PING_TIMEOUT_S)
        except NoRespondersError:
            return True
        except (NatsTimeoutError, asyncio.TimeoutError, Exception):  # busy, or the bus is down: unknown
            return False
        return False

    async def _lost(self, holder: str, orphans: list[str]) -> None:
        rids = list(self._held.pop(holder, {}))
        for rid in rids:
            self._by_rid.pop(rid, None)
        for rid in orphans:  # unacknowledged: perhaps lost in the dead scheduler's buffers
            if self._unacked.pop(rid, None) is not None:
                rids.append(rid)
        if rids:
            log.warning("the scheduler holding %d request(s) is gone (%s); recovering them", len(rids), holder)
            await self.on_lost(holder, rids, True)
