"""Which workers are alive, from their heartbeats (and any other message they send).

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

from shared import bus, subjects
from shared.messages import WorkerHeartbeat

log = logging.getLogger(__name__)
_decoder = msgspec.msgpack.Decoder(WorkerHeartbeat)
LOADING_TIMEOUT_S = 60.0  # a worker loading models may be slow to beat; a crash is still noticed


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
    ) -> None:
        self.nc = nc
        self.timeout_s = timeout_s
        self.on_gone = on_gone
        self.on_back = on_back
        self.seen: dict[str, float] = {}
        self.gone: set[str] = set()
        self.loading: set[str] = set()  # workers whose last heartbeat reported loads in progress
        self.beats: dict[str, WorkerHeartbeat] = {}  # each worker's last heartbeat (its budget, its selector)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.nc.subscribe(subjects.WORKER_HEARTBEAT, cb=self._on_heartbeat)
        self._task = asyncio.create_task(self._expire())

    def stop(self) -> None:
        if self._task:
            self._task.cancel()

    def heard(self, worker: str) -> None:
        self.seen[worker] = time.monotonic()

    async def _on_heartbeat(self, msg: Msg) -> None:
        beat = bus.decode(_decoder, msg, log)
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
                del self.seen[worker]
                self.loading.discard(worker)
                self.gone.add(worker)
                await self.on_gone(worker)
