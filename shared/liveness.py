"""Which workers are alive, from their heartbeats (and any other message they send)."""

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
        if worker in self.gone:
            self.gone.discard(worker)
            log.warning("worker %s is back", worker)
            if self.on_back is not None:
                await self.on_back(worker)

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.timeout_s / 4))
            cutoff = time.monotonic() - self.timeout_s
            for worker in [w for w, seen in self.seen.items() if seen < cutoff]:
                del self.seen[worker]
                self.gone.add(worker)
                await self.on_gone(worker)
