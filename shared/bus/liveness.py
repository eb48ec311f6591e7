"""Which workers are alive: from what NATS says about their connection first, and from their
heartbeats (and any other message they send) as a fallback.

A worker that dies, or whose host is cut off, is found by NATS before its heartbeat stops
counting: its connection closes (or its route to the other nodes misses its pings), the server
drops its subscriptions, and a request to the subject only that worker answers
(`subjects.worker_alive`) comes back "no responders" at once. Where asked (`probe`, the
schedulers), each worker is asked every `PROBE_S`, so a dead worker is dropped within about a
second. Only a worker that has answered a probe before is judged by one (a worker of an older
version, or one whose subscription has not reached this node yet, is left to its heartbeat).
A python model's process (one per instance: hundreds of them) is not probed: the worker that
started it sees it exit and says so (`WorkerExited`), sooner than a probe would find it, and
when that worker is gone its processes (`<worker>-py-...`, which die with it) go too.

A worker whose heartbeat is late is asked too, before anything is decided (issue 33): a busy
machine delays heartbeats by seconds (a worker's beat thread, its loop and this process all wait
for a core), and a worker declared gone because of it had its models go UNAVAILABLE and come back,
over and over. So a late heartbeat alone never drops a worker that NATS still holds:
- it answers: it is alive, its beat was late;
- "no responders": its connection is gone, it is dropped;
- no answer in time: NATS still delivers to its subscription, so its connection lives and the
  worker (or this process) is only slow. It is given `PATIENT_TIMEOUT_S` of silence before it is
  dropped: only a worker stuck with a live connection (a deadlocked loop, a stopped process) or one
  cut off before NATS noticed stays silent that long.

Two more things never count as a worker's death (issue 17): a load in progress (a worker whose
last heartbeat reported loads gets `PATIENT_TIMEOUT_S` too), and this process's own deafness: when
the expiry task wakes up late, the heartbeats may be waiting unread in the subscription, so every
worker is credited the time this loop was too busy to listen.

This process's own lost connection is deafness too (a nats-server restart): nothing was heard
meanwhile, and the server it comes back to may be a new one that the workers have not reached yet,
which answers "no responders" for every worker for a moment. So an answer to a question asked
while the connection was away says nothing, and once it is back every worker gets a whole
`timeout_s` to be heard again and is judged by a probe only after it has answered one since.

A worker declared gone is back when it beats again, but its heartbeat has a connection of its own
(services/worker/heartbeat.py), which may reconnect before the worker's main one: what `on_back`
sends the worker (report your models, announce your credits) would then find no subscriber and be
lost, leaving its models UNAVAILABLE. So it is welcomed back once its main connection answers its
liveness subject: nats-py restores all of a connection's subscriptions, in one write, before
anything else it sends.
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
from shared.wire.messages import WorkerExited, WorkerHeartbeat

log = logging.getLogger(__name__)
_decoder = msgspec.msgpack.Decoder(WorkerHeartbeat)
_exited_decoder = msgspec.msgpack.Decoder(WorkerExited)
INCARNATION = 7  # a worker process's id on the bus: the id it was started with, "-" and 6 hex digits
PATIENT_TIMEOUT_S = 60.0  # a worker loading, or one NATS still holds: slow to beat, not dead
PROBE_S = 0.5  # how often each worker's connection is asked after
PROBE_TIMEOUT_S = 1.0
CHECK_TRIES = 5  # `check`: asked this often, PROBE_S / 5 apart, while NATS cannot say


def overdue(seen: dict[str, float], loading: set[str], now: float, timeout_s: float) -> list[str]:
    """Workers silent for longer than they may be: `timeout_s`, or `PATIENT_TIMEOUT_S` while loading."""
    return [w for w, t in seen.items() if now - t > (max(timeout_s, PATIENT_TIMEOUT_S) if w in loading else timeout_s)]


def verdict(connected: bool | None, silent_s: float) -> bool:
    """Whether a worker whose heartbeat is overdue is gone, given what NATS said when asked:
    True (it answered: alive), False ("no responders": gone) or None (no answer in time: its
    connection lives, it is busy, unless it has been silent for `PATIENT_TIMEOUT_S`)."""
    if connected is None:
        return silent_s > PATIENT_TIMEOUT_S
    return not connected


class WorkerLiveness:
    """Calls `on_gone(worker)` once for a worker that is gone (NATS says its connection is, or it
    was silent for `timeout_s` and NATS cannot say), and `on_back(worker)` when one declared gone
    is heard again (a paused process, a healed partition)."""

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
        self._stopped: set[str] = set()  # workers being dropped that said they stopped cleanly (code 0)
        self.loading: set[str] = set()  # workers whose last heartbeat reported loads in progress
        self.beats: dict[str, WorkerHeartbeat] = {}  # each worker's last heartbeat (its budget, its selector)
        self.probe = probe
        self.found_by_nats = 0  # workers dropped because NATS said their connection was gone
        self.found_by_parent = 0  # python model processes dropped because their worker saw them exit
        self._answered: set[str] = set()  # workers that answered a probe: "no responders" now means gone
        self._task: asyncio.Task[None] | None = None
        self._prober: asyncio.Task[None] | None = None
        self._returning: dict[str, asyncio.Task[None]] = {}  # gone workers beating again, not yet welcomed
        self._lost_at: float | None = None  # when this process's own connection went, while it is away
        self._turns = 0  # how many times it went or came back: an answer across a turn says nothing

    async def start(self) -> None:
        await self.nc.subscribe(subjects.WORKER_HEARTBEAT, cb=self._on_heartbeat)
        await self.nc.subscribe(subjects.WORKER_EXITED, cb=self._on_exited)
        connection.on_connection(self.nc, self._bus_lost, self._bus_back)
        self._task = asyncio.create_task(self._expire())
        if self.probe:
            self._prober = asyncio.create_task(self._probe_forever())

    def stop(self) -> None:
        for task in (self._task, self._prober, *self._returning.values()):
            if task:
                task.cancel()

    def _bus_lost(self) -> None:
        self._turns += 1
        if self._lost_at is None:
            self._lost_at = time.monotonic()

    def _bus_back(self) -> None:
        """Back from an outage of our own: every worker has `timeout_s` from now to be heard, and
        "no responders" counts again for a worker only once it has answered a probe since."""
        self._lost_at = None
        self._turns += 1
        now = time.monotonic()
        for worker in self.seen:
            self.seen[worker] = max(self.seen[worker], now)
        self._answered.clear()

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
        if worker in self.gone and worker not in self._returning:
            self._returning[worker] = asyncio.create_task(self._welcome_back(worker))

    async def _welcome_back(self, worker: str) -> None:
        """A worker declared gone beats again: it is back once its main connection answers (its
        beat may have come over its heartbeat thread's connection, back sooner). An older worker
        without the liveness subject is welcomed after `PATIENT_TIMEOUT_S` of beats."""
        returned = time.monotonic()
        try:
            while worker in self.gone and worker in self.seen:
                answered = await self._connected(worker)
                if answered or time.monotonic() - returned > PATIENT_TIMEOUT_S:
                    self.gone.discard(worker)
                    log.warning("worker %s is back", worker)
                    if self.on_back is not None:
                        await self.on_back(worker)
                    return
                await asyncio.sleep(PROBE_S)
        finally:
            self._returning.pop(worker, None)

    async def _on_exited(self, msg: Msg) -> None:
        """The worker that started a python model's process saw it exit: it is gone, now."""
        exited = connection.decode(_exited_decoder, msg, log)
        if exited is None:
            return
        for worker in [
            w for w in self.seen if w.startswith(exited.worker + "-") and len(w) == len(exited.worker) + INCARNATION
        ]:
            if exited.code == 0:  # stopped on purpose (a drain, `shoal serve` stopping): no warning
                self._stopped.add(worker)
                log.info("worker %s stopped; dropping it", worker)
            else:
                log.warning("worker %s exited (code %d); dropping it", worker, exited.code)
            self.found_by_parent += 1
            await self._drop(worker)

    def supervised(self, worker: str) -> bool:
        """A python model's process: the worker that started it says when it exits (`_on_exited`),
        so it is not probed every `PROBE_S`, only asked when its heartbeat is late."""
        beat = self.beats.get(worker)
        return beat is not None and beat.supervised

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
            late = overdue(self.seen, self.loading, now, self.timeout_s)
            if late:
                await self._judge(late, now)

    async def _judge(self, late: list[str], now: float) -> None:
        """Workers whose heartbeat is overdue: NATS is asked about each before any is dropped."""
        answers = await asyncio.gather(*(self._connected(w) for w in late))
        for worker, connected in zip(late, answers):
            silent_s = now - self.seen.get(worker, now)
            if connected:
                self._answered.add(worker)
                self.heard(worker)  # alive: only its beat was late
            elif verdict(connected, silent_s):
                if connected is None:
                    log.warning("worker %s silent for %.0f s with a live connection; dropping it", worker, silent_s)
                await self._drop(worker)

    def stopped_on_purpose(self, worker: str) -> bool:
        """Whether `worker`, being dropped, said it stopped cleanly (exit code 0): news, not a fault."""
        return worker in self._stopped

    async def _drop(self, worker: str) -> None:
        if self.seen.pop(worker, None) is None:
            return  # dropped already (by the other path)
        self._answered.discard(worker)
        self.loading.discard(worker)
        self.gone.add(worker)
        quiet = worker in self._stopped
        await self.on_gone(worker)
        # its python models' processes die with it (services/worker/python/processes/isolation.py), unprobed
        for child in [w for w in self.seen if w.startswith(f"{worker}-py-") and self.supervised(w)]:
            log.log(logging.INFO if quiet else logging.WARNING, "worker %s went with the worker that started it", child)
            await self._drop(child)
        self._stopped.discard(worker)

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(PROBE_S)
            workers = [w for w in self.seen if not self.supervised(w)]
            answers = await asyncio.gather(*(self._connected(w) for w in workers))
            for worker, connected in zip(workers, answers):
                if connected:
                    self._answered.add(worker)
                    self.heard(worker)  # an answer is as good as a beat
                elif connected is False and worker in self._answered and worker in self.seen:
                    log.warning("worker %s has no connection to NATS any more; dropping it", worker)
                    self.found_by_nats += 1
                    await self._drop(worker)

    async def check(self, worker: str) -> bool:
        """A sign that `worker` may be gone (its local channel closed, docs/design.md §9): NATS is
        asked now instead of at the next probe, a few times while it cannot say (the server may
        not have seen the worker's connection close yet). True: it was dropped (or was already)."""
        for _ in range(CHECK_TRIES):
            if worker not in self.seen:
                return True
            connected = await self._connected(worker)
            if connected:
                return False
            if connected is False:
                log.warning("worker %s closed its local channel and has no connection to NATS; dropping it", worker)
                self.found_by_nats += 1
                await self._drop(worker)
                return True
            await asyncio.sleep(PROBE_S / 5)
        return False

    async def _connected(self, worker: str) -> bool | None:
        """True: it answered; False: NATS knows no such subscriber; None: unknown (no answer in
        time, or "no responders" from a server this connection was away from meanwhile: a
        restarted one that the worker has not reconnected to yet)."""
        turns = self._turns
        try:
            await self.nc.request(subjects.worker_alive(worker), b"", timeout=PROBE_TIMEOUT_S)
        except NoRespondersError:
            return None if self._lost_at is not None or self._turns != turns else False
        except Exception:  # busy, or our own bus is down
            return None
        return True
