"""The worker's heartbeat, sent from a thread of its own on a NATS connection of its own.

Liveness must not depend on how busy the worker's event loop is: with hundreds of models to
load, the loop spends seconds on load reports and bookkeeping while loader threads contend for
the GIL, and a heartbeat sent from the loop arrives late enough for the repository and the
schedulers to declare the worker dead (issue 17). This thread owns a small event loop and
connection whose only job is the beat, so a beat goes out every `interval` whatever the main
loop does.

It is not a blind timer: the main loop refreshes the beat's contents (`update`) on each of its
own ticks, and when the main loop has not done so for `stall_s` the thread stops beating, so a
worker whose loop is truly stuck is still declared dead.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from nats.aio.client import Client as NATS

from shared.bus import connection
from shared.wire import subjects
from shared.wire.messages import WorkerHeartbeat, encode

log = logging.getLogger("shoal.worker")
STALL_S = 60.0  # a main loop silent this long is stuck, not busy: stop vouching for it


class HeartbeatThread:
    def __init__(
        self,
        nats_url: str,
        name: str,
        interval_s: float,
        loading: Callable[[], int],
        stall_s: float = STALL_S,
        credentials: str = "",
    ) -> None:
        self.nats_url = nats_url
        self.credentials = credentials  # the worker's own identity (docs/security.md)
        self.name = name
        self.interval_s = interval_s
        self.loading = loading  # loads in progress, read at each beat
        self.stall_s = stall_s
        self._beat: WorkerHeartbeat | None = None
        self._updated = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._started.wait(timeout=10)

    def update(self, beat: WorkerHeartbeat) -> None:
        """The latest contents, from the main loop: also the proof that loop is alive."""
        self._beat = beat
        self._updated = time.monotonic()

    def beat_now(self) -> None:
        """Send the next beat at once, from any thread: when the loads end, the last beat must not
        go on saying "loading" (a loading worker is given far longer before it is taken for dead)."""
        if self._loop is not None and self._wake is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._started.set()
        nc: NATS | None = None
        try:
            nc = await connection.connect(self.nats_url, self.name, self.credentials)
            while not self._stop.is_set():
                await self._send(nc)
                await self._pause(self._stop, self._wake)
        except Exception:
            log.exception("the heartbeat thread failed; the worker will be taken for dead")
        finally:
            if nc is not None:
                await nc.close()

    async def _pause(self, stop: asyncio.Event, wake: asyncio.Event) -> None:
        """Until the next beat is due, or the worker asks for one now, or the thread stops."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
        try:
            await asyncio.wait(waits, timeout=self.interval_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        wake.clear()

    async def _send(self, nc: NATS) -> None:
        beat = self._beat
        stalled = time.monotonic() - self._updated
        if beat is None or stalled > self.stall_s:
            if beat is not None:
                log.error("the worker's event loop has not run for %.0f s: no heartbeat", stalled)
            return
        beat.loading = self.loading()
        await nc.publish(subjects.WORKER_HEARTBEAT, encode(beat))


class LoopHeartbeat:
    """The beat of a python model's process, sent from its event loop on its one connection.

    A python model's process hosts one model (one instance of it, by default): its loop never has
    hundreds of loads to report, the worker that started it says when it exits, and a late beat
    no longer drops a worker whose connection lives (shared/bus/liveness.py). So it needs no thread
    and no second connection of its own (hundreds of processes would hold hundreds of each); the
    interface is `HeartbeatThread`'s."""

    def __init__(self, nc: NATS, loading: Callable[[], int]) -> None:
        self.nc = nc
        self.loading = loading
        self._beat: WorkerHeartbeat | None = None
        self._sending: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        pass

    def update(self, beat: WorkerHeartbeat) -> None:
        """The main loop's tick: the beat goes out now."""
        self._beat = beat
        self.beat_now()

    def beat_now(self) -> None:
        """On the event loop (the loader's end of loads, the tick)."""
        if self._beat is None:
            return
        self._beat.loading = self.loading()
        task = asyncio.ensure_future(self.nc.publish(subjects.WORKER_HEARTBEAT, encode(self._beat)))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def stop(self) -> None:
        pass
