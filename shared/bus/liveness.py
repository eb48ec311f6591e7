"""Which workers are alive, from their heartbeats (and any other message they send), and,
where asked (`probe`), from what NATS says about their connection.

A worker that dies, or whose host is cut off, is found by NATS before its heartbeat stops
counting: its connection closes (or its route to the other nodes misses its pings), the server
drops its subscriptions, and a request to the subject only that worker answers
(`subjects.worker_alive`) comes back "no responders" at once. The probe asks each worker every
`PROBE_S`, so a dead worker is dropped within about a second; the heartbeat timeout stays as
the fallback for a silence NATS has not noticed yet (a partition inside nats-server's ping
interval, a stuck worker whose connection lives). A probe that times out (a busy worker) or
fails because this process's own bus is down proves nothing and changes nothing, and only a
worker that has answered a probe before is judged by one (a worker of an older version, or one
whose subscription has not reached this node yet, is left to its heartbeat).

Two things never count as a worker's death (issue 17): a load in progress (a worker whose last
heartbeat reported loads gets `LOADING_TIMEOUT_S`), and this process's own deafness: when the
expiry task wakes up late, the heartbeats may be waiting unread in the subscription, so every
worker is credited the time this loop was too busy to listen.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import NoRespondersError

from shared.bus import connection
from shared.wire import subjects
from shared.wire.messages import WorkerHeartbeat

log = logging.getLogger(__name__)
_decoder = msgspec.msgpack.Decoder(WorkerHeartbeat)
LOADING_TIMEOUT_S = 60.0  # a worker loading models may be slow to beat; a crash is still noticed
PROBE_S = 0.5  # how often each worker's connection is asked after
PROBE_TIMEOUT_S = 1.0


def overdue(seen: dict[str, float], loading: set[str], now: float, timeout_s: float) -> list[str]:
    """Workers silent for longer than they may be: `timeout_s`, or `LOADING_TIMEOUT_S` while loading."""
    return [w for w, t in seen.items() if now - t > (max(timeout_s, LOADING_TIMEOUT_S) if w in loading else timeout_s)]


class WorkerLiveness:
    """Calls `on_gone(worker)` once for a worker silent for `timeout_s`, and `on_back(worker)`
    when one declared gone is heard again (a paused process, a healed partition)."""

    def __init__(
        self,
        nc: NATS,
        timeout_s: float,
        on_gone: Callable[[str], Awaitable[None]],
        on_back: Callable[[str], Awaitable[None]] | None = None,
        probe: bool = False,
    ) -> None:
        self.nc = nc
        self.timeout_s = timeout_s
        self.on_gone = on_gone
        self.on_back = on_back
        self.seen: dict[str, float] = {}
        self.gone: set[str] = set()
        self.loading: set[str] = set()  # workers whose last heartbeat reported loads in progress
        self.beats: dict[str, WorkerHeartbeat] = {}  # each worker's last heartbeat (its budget, its selector)
        self.probe = probe
        self.found_by_nats = 0  # workers dropped because NATS said their connection was gone
        self._answered: set[str] = set()  # workers that answered a probe: "no responders" now means gone
        self._task: asyncio.Task[None] | None = None
        self._prober: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.nc.subscribe(subjects.WORKER_HEARTBEAT, cb=self._on_heartbeat)
        self._task = asyncio.create_task(self._expire())
        if self.probe:
            self._prober = asyncio.create_task(self._probe_forever())

    def stop(self) -> None:
        for task in (self._task, self._prober):
            if task:
                task.cancel()

    @property
    def answering(self) -> frozenset[str]:
        """The workers the probe judges: they answered it once."""
        return frozenset(self._answered)

    def heard(self, worker: str) -> None:
        self.seen[worker] = time.monotonic()

    async def _on_heartbeat(self, msg: Msg) -> None:
        beat = connection.decode(_decoder, msg, log)
        if beat is None:
            return
        worker = beat.worker
        self.heard(worker)
        self.beats[worker] = beat
        if beat.loading:
            self.loading.add(worker)
        else:
            self.loading.discard(worker)
        if worker in self.gone:
            self.gone.discard(worker)
            log.warning("worker %s is back", worker)
            if self.on_back is not None:
                await self.on_back(worker)

    async def _expire(self) -> None:
        interval = min(1.0, self.timeout_s / 4)
        while True:
            before = time.monotonic()
            await asyncio.sleep(interval)
            now = time.monotonic()
            deaf = now - before - interval
            if deaf > interval:  # this loop was busy: what it could not hear is not the workers' silence
                for worker in self.seen:
                    self.seen[worker] += deaf
                continue
            for worker in overdue(self.seen, self.loading, now, self.timeout_s):
                await self._drop(worker)

    async def _drop(self, worker: str) -> None:
        if self.seen.pop(worker, None) is None:
            return  # dropped already (by the other path)
        self._answered.discard(worker)
        self.loading.discard(worker)
        self.gone.add(worker)
        await self.on_gone(worker)

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(PROBE_S)
            workers = list(self.seen)
            answers = await asyncio.gather(*(self._connected(w) for w in workers))
            for worker, connected in zip(workers, answers):
                if connected:
                    self._answered.add(worker)
                elif connected is False and worker in self._answered and worker in self.seen:
                    log.warning("worker %s has no connection to NATS any more; dropping it", worker)
                    self.found_by_nats += 1
                    await self._drop(worker)

    async def _connected(self, worker: str) -> bool | None:
        """True: it answered; False: NATS knows no such subscriber; None: unknown."""
        try:
            await self.nc.request(subjects.worker_alive(worker), b"", timeout=PROBE_TIMEOUT_S)
        except NoRespondersError:
            return False
        except Exception:  # busy, or our own bus is down
            return None
        return True
