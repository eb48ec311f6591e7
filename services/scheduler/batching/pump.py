"""Batch dispatch: requests are admitted to their model version's queue, and when the queue has
work and a worker credit, its discipline (`discipline.py`: the dynamic batcher or the sequence
batcher) decides what to send, and the pump sends the batch to that instance.

Requests arrive here already decoded to their header (`Pending`); the original bytes are
forwarded in the batch. The pump keeps what every kind of queue shares: the queues, the
credits' rate limiter, the batches in flight (`flights.py`), the answers the scheduler gives
itself (`answers.py`) and timers; the completion path (`credits.py`) gives credits back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol

import msgspec
from nats.aio.client import Client as NATS

from services.scheduler.batching.answers import Answers
from services.scheduler.batching.batch_spans import batch_done, batch_sent
from services.scheduler.batching.discipline import Host
from services.scheduler.batching.flights import Flights
from services.scheduler.batching.formation import Decision
from services.scheduler.batching.model_queue import Discipline, ModelQueue
from services.scheduler.batching.prefetch import may_prefetch
from services.scheduler.batching.queues import Priorities
from services.scheduler.batching.ratelimit import RateLimiter, instance_needs
from services.scheduler.batching.worker_channels import WorkerChannels
from services.scheduler.scheduling_records import InFlight, Key, Pending, Slot
from services.scheduler.statistics.reasons import FailReason
from services.scheduler.tasks import Tasks
from shared.bus import hot_path
from shared.bus.hot_path import Outgoing
from shared.config.metric_config import first_response_buckets
from shared.config.model_config import ModelSpec
from shared.tracing import spans
from shared.wire import subjects
from shared.wire.messages import ExecBatch, RequestHeader, SeqControl, encode

log = logging.getLogger("shoal.scheduler")


class DisciplineChooser(Protocol):
    """Which discipline serves a version with this config (`services/scheduler/discipline_factory.py`)."""

    def choose(self, key: Key, spec: ModelSpec | None, host: Host) -> Discipline: ...


class Pump:
    def __init__(
        self,
        nc: NATS,
        limiter: RateLimiter,
        tasks: Tasks,
        flights: Flights,
        answers: Answers,
        chooser: DisciplineChooser,
        local_inbox: str = "",
        channels: WorkerChannels | None = None,
        prefix_routing: bool = True,
    ) -> None:
        self.nc = nc
        self.prefix_routing = prefix_routing  # requests with prefix blocks go where those were sent
        self.channels = channels  # co-hosted in a gateway: the local channels to this host's workers
        # co-hosted in a gateway: a batch whose requests all came from that gateway's inbox is
        # answered and completed there in one message (`ExecBatch.complete_to`)
        self._local_prefix = f"{local_inbox}." if local_inbox else ""
        self._local_done = subjects.batch_done(local_inbox) if local_inbox else ""
        self.limiter = limiter
        self.tasks = tasks
        self.flights = flights
        self.answers = answers
        self.chooser = chooser
        self.queues: dict[Key, ModelQueue] = {}

    # -- queues ---------------------------------------------------------------------
    def queue(self, model: str, version: int) -> ModelQueue:
        key = (model, version)
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = ModelQueue(key, self.chooser.choose(key, None, self))
        return queue

    def find(self, key: Key) -> ModelQueue | None:
        return self.queues.get(key)

    def all(self) -> list[ModelQueue]:
        return list(self.queues.values())

    def of_model(self, model: str) -> list[ModelQueue]:
        return [q for k, q in self.queues.items() if k[0] == model]

    def configure(self, queue: ModelQueue, spec: ModelSpec) -> None:
        """The version's (new) config: priorities, rate-limiter needs, and the discipline that
        serves it (kept across a reload that it can serve, else replaced and retired)."""
        queue.spec = spec
        queue.stats.latencies.use_buckets(first_response_buckets(spec.config))
        queue.priorities = Priorities.from_json(spec.config.get("dynamic_batching"))
        queue.needs = instance_needs(spec.config)
        self.limiter.learn(queue.needs)
        if not queue.discipline.adopt(spec):
            old, queue.discipline = queue.discipline, self.chooser.choose(queue.key, spec, self)
            self.spawn(old.retire(queue))

    def idle(self, key: Key) -> bool:
        """Nothing queued and no batch in flight."""
        queue = self.queues.get(key)
        return (queue is None or not queue.discipline.queued()) and not self.flights.count(key)

    def pending(self, queue: ModelQueue) -> int:
        """Requests not started yet: queued here, or sent ahead and waiting at their instance."""
        return queue.discipline.queued() + self.flights.waiting_requests(queue.key)

    def oldest_wait_s(self, queue: ModelQueue) -> float:
        """How long the longest-waiting request not started yet has waited (queued here, or sent ahead
        and waiting at its instance); 0 when none waits. The autoscaler's queue-time signal."""
        first = queue.discipline.oldest()
        for flight in self.flights.waiting(queue.key) if self.flights.table else ():
            for pending in flight.requests:
                if pending.header.rid not in flight.cancelled and (first is None or pending.arrived < first):
                    first = pending.arrived
        return 0.0 if first is None else max(0.0, time.monotonic() - first)

    def instances_in_use(self, queue: ModelQueue) -> tuple[int, int]:
        """(instances holding a batch, instances known by a credit or a batch) of the model version, as
        this replica sees them: the instance utilisation signal."""
        busy = self.flights.instances_busy(queue.key)
        known = busy | {(slot.worker, slot.instance) for slot in queue.free}
        return len(busy), len(known)

    # -- arrivals -------------------------------------------------------------------
    async def admit(self, queue: ModelQueue, header: RequestHeader, raw: msgspec.Raw, now: float) -> bool:
        """Queue a request at its priority level (its queue policy's timeout from now), or refuse it."""
        level = queue.priorities.level(header.priority)
        timeout_us = queue.priorities.policy(level).timeout_us(header.timeout_us)
        enqueued_ns = time.monotonic_ns() if header.trace or header.traceparent else 0
        deadline_ns = time.time_ns() + timeout_us * 1000 if timeout_us else 0
        return await queue.discipline.admit(queue, Pending(header, raw, now, enqueued_ns, level, deadline_ns))

    async def cancel(self, queue: ModelQueue, rid: str) -> None:
        """A client went away: its request leaves the queue (a running batch finishes)."""
        await queue.discipline.cancel(queue, rid)

    async def abandon(self, queue: ModelQueue, message: str) -> None:
        """The version is gone: fail what still waits for it (a drain normally left nothing)."""
        queue.free.clear()
        await queue.discipline.abandon(queue, message)

    # -- batches --------------------------------------------------------------------
    async def pump(self, queue: ModelQueue) -> None:
        """Send what the queue's free credits can take now; be back when a batch is due."""
        if queue.timer is not None:
            queue.timer.cancel()
            queue.timer = None
        await queue.discipline.pump(queue)

    async def pump_held_back(self) -> None:
        """Resources were released: every queue the rate limiter held back may run now."""
        if self.limiter.enabled:
            for queue in list(self.queues.values()):
                if queue.free and queue.discipline.queued():
                    await self.pump(queue)

    def ended(self, flight: InFlight) -> None:
        """A batch ended (completed, given up, its worker lost): its resources return, and its
        discipline hears of it."""
        queue = self.queue(*flight.key)
        if flight.span is not None and spans.active is not None:
            batch_done(spans.active, flight.span)
        self.limiter.release(queue.need(flight.slot.instance), flight.slot.worker)
        queue.discipline.finished(queue, flight)

    # -- for the disciplines (`discipline.Host`) ------------------------------------------
    @property
    def max_batch_bytes(self) -> int:
        return self.nc.max_payload - 64 * 1024 if self.nc.max_payload else 1 << 20

    def can_run(self, queue: ModelQueue, slot: Slot) -> bool:
        """Whether the rate limiter lets the slot's instance run a batch now."""
        return self.limiter.can_run(queue.need(slot.instance), slot.worker)

    def take_slot(self, queue: ModelQueue, decision: Decision, route: Sequence[int] = ()) -> Slot | None:
        """A credit of an instance the rate limiter lets run: preferably one with nothing running
        (only such one unless the batch may be sent ahead, `prefetch.py`), then the fewest batches
        started for its priority, then the oldest credit. A batch whose first request has prefix
        blocks goes, among the instances as free as the freest, where `prefix_router` says (its
        load replaces the batches started)."""
        prefetch = may_prefetch(queue.priorities, self.limiter.enabled, decision)
        candidates = [
            (
                self.flights.busy(queue.key, slot),
                self.limiter.weight(queue.need(slot.instance), (slot.worker, queue.key, slot.instance)),
                index,
            )
            for index, slot in enumerate(queue.free)
            if self.can_run(queue, slot) and (prefetch or not self.flights.busy(queue.key, slot))
        ]
        if not candidates:
            return None
        index = self._by_prefix(queue, route, candidates) if route and self.prefix_routing else min(candidates)[2]
        slot = queue.free[index]
        del queue.free[index]
        return slot

    def _by_prefix(self, queue: ModelQueue, route: Sequence[int], candidates: list[tuple[bool, int, int]]) -> int:
        """The credit of the instance the prefix router picks for these blocks, among those with
        nothing running if any; the router learns where they went."""
        busy = min(candidates)[0]
        first: dict[tuple[str, int], int] = {}  # instance -> its first credit in line
        for rank in sorted(candidates):
            slot = queue.free[rank[2]]
            if rank[0] == busy and (slot.worker, slot.instance) not in first:
                first[(slot.worker, slot.instance)] = rank[2]
        running = self.flights.running
        in_flight = {target: running[(target[0], queue.key, target[1])] for target in first}
        target = queue.router.choose(route, in_flight)
        queue.router.routed(route, target)
        return first[target]

    async def send(
        self,
        queue: ModelQueue,
        slot: Slot,
        batch: list[Pending],
        now: float,
        reason: str,
        controls: list[SeqControl] | None = None,
    ) -> bool:
        """Send a batch on a credit; False (the requests failed, the credit back) if it cannot go."""
        batch_id = self.flights.next_id()
        queue_ns = [int((now - p.arrived) * 1e9) for p in batch]
        for ns in queue_ns:
            queue.stats.record_queue(ns)
        message = ExecBatch(
            batch_id=batch_id,
            model=queue.key[0],
            version=queue.key[1],
            instance=slot.instance,
            requests=[p.raw for p in batch],
            queue_ns=queue_ns,
            reply_via_scheduler=queue.preserve_ordering,
            credit=slot.credit,
            generation=slot.generation,
            reason=reason,
            enqueued_ns=[p.enqueued_ns for p in batch] if any(p.header.trace for p in batch) else [],
            controls=controls or [],
            complete_to=self._complete_to(batch),
        )
        try:
            payload = encode(message)
            # the channel only once the instance holds nothing sent over NATS: no batch overtakes another
            over_bus = (
                self.channels is None
                or self.flights.sent_over_bus(queue.key, slot)
                or not self.channels.send(slot, payload)
            )
            if over_bus:
                await hot_path.publish_all(self.nc, [Outgoing(slot.subject, payload)])  # one write a turn
        except Exception as exc:  # not sent: the credit is still the worker's to use, the requests fail
            log.error("cannot send a batch of '%s' to worker %s: %s", queue.key[0], slot.worker, exc)
            queue.free.appendleft(slot)
            for pending in batch:
                await self.answers.fail(
                    queue, pending.header, f"cannot reach worker {slot.worker}: {type(exc).__name__}"
                )
            return False
        flight = InFlight(queue.key, slot, batch, now, over_bus)
        if spans.active is not None:  # opentelemetry mode: the batch's spans (one comparison when off)
            flight.span = batch_sent(spans.active, queue.key, slot, batch, batch_id, reason)
        self.flights.start(batch_id, flight)
        self.limiter.acquire(queue.need(slot.instance), slot.worker, (slot.worker, queue.key, slot.instance))
        return True

    def _complete_to(self, batch: list[Pending]) -> str:
        prefix = self._local_prefix
        if prefix and all(p.header.reply.startswith(prefix) for p in batch):
            return self._local_done
        return ""

    async def fail(
        self, queue: ModelQueue, header: RequestHeader, message: str, reason: FailReason = FailReason.OTHER
    ) -> None:
        await self.answers.fail(queue, header, message, reason)

    async def dropped(self, queue: ModelQueue, header: RequestHeader, reason: FailReason) -> None:
        await self.answers.dropped(queue, header, reason)

    def waiting(self, key: Key) -> list[InFlight]:
        return self.flights.waiting(key)

    def after(self, delay_s: float, job: Callable[[], Awaitable[Any]]) -> asyncio.TimerHandle:
        return self.tasks.after(delay_s, job)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.tasks.spawn(coro)
