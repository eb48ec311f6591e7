"""Batch formation and dispatch: when a model's queue has work and a worker credit, the
batcher (`batcher.next_batch`) decides what to send, and the batch goes to that instance.

Requests arrive here already decoded to their header (`Pending`); the original bytes are
forwarded in the batch. Sequence-batched models are run by the sequence batcher, which uses
the same dispatch (`SequenceBatching`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from services.scheduler.batching.answers import Answers
from services.scheduler.batching.flights import Flights
from services.scheduler.batching.formation import next_batch
from services.scheduler.batching.interfaces import SequenceBatching
from services.scheduler.batching.model_queue import ModelQueue, policy_for
from services.scheduler.batching.prefetch import may_prefetch
from services.scheduler.batching.queues import Priorities
from services.scheduler.batching.ratelimit import RateLimiter, instance_needs
from services.scheduler.records import InFlight, Key, Pending, Slot
from services.scheduler.statistics.reasons import FailReason
from services.scheduler.tasks import Tasks
from shared import subjects
from shared.logcontext import request_ids
from shared.messages import ExecBatch, RequestHeader, SeqControl, encode
from shared.model_config import ModelSpec

log = logging.getLogger("shoal.scheduler")


class Pump:
    def __init__(
        self,
        nc: NATS,
        limiter: RateLimiter,
        tasks: Tasks,
        sequences: Callable[[Pump], SequenceBatching],
        local_inbox: str = "",
    ) -> None:
        self.nc = nc
        # co-hosted in a gateway: a batch whose requests all came from that gateway's inbox is
        # answered and completed there in one message (`ExecBatch.complete_to`)
        self._local_prefix = f"{local_inbox}." if local_inbox else ""
        self._local_done = subjects.batch_done(local_inbox) if local_inbox else ""
        self.limiter = limiter
        self.tasks = tasks
        self.queues: dict[Key, ModelQueue] = {}
        self.flights = Flights(self._flight_ended)
        self.answers = Answers(nc.publish)
        self.sequences = sequences(self)

    # -- queues ---------------------------------------------------------------------
    def queue(self, model: str, version: int) -> ModelQueue:
        key = (model, version)
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = ModelQueue(key)
        return queue

    def find(self, key: Key) -> ModelQueue | None:
        return self.queues.get(key)

    def of_model(self, model: str) -> list[ModelQueue]:
        return [q for k, q in self.queues.items() if k[0] == model]

    def sequence_queues(self, model: str) -> list[ModelQueue]:
        return [q for q in self.of_model(model) if q.seq is not None]

    def configure(self, queue: ModelQueue, spec: ModelSpec) -> None:
        """The version's (new) config: batching policy, priorities, rate-limiter needs."""
        queue.spec, queue.policy = spec, policy_for(spec)
        queue.priorities = Priorities.from_json(spec.config.get("dynamic_batching"))
        queue.needs = instance_needs(spec.config)
        self.limiter.learn(queue.needs)
        self.sequences.configure(queue)

    def idle(self, key: Key) -> bool:
        """Nothing queued and no batch in flight."""
        queue = self.queues.get(key)
        return (queue is None or not queue.pending_count) and not self.flights.count(key)

    # -- arrivals -------------------------------------------------------------------
    async def admit(self, queue: ModelQueue, header: RequestHeader, raw: msgspec.Raw, now: float) -> bool:
        """Queue a request at its priority level, or refuse it (queue full) at once."""
        level = queue.priorities.level(header.priority)
        policy = queue.priorities.policy(level)
        if policy.max_queue_size and queue.requests.size(level) >= policy.max_queue_size:
            await self.answers.fail(queue, header, "Exceeds maximum queue size", FailReason.REJECTED)
            return False
        timeout_us = policy.timeout_us(header.timeout_us)
        enqueued_ns = time.monotonic_ns() if header.trace else 0
        deadline_ns = time.time_ns() + timeout_us * 1000 if timeout_us else 0
        pending = Pending(header, raw, now, enqueued_ns, level, deadline_ns)
        if queue.seq is not None:
            return await self.sequences.admit(queue, pending)
        queue.requests.append(pending)
        if queue.preserve_ordering:
            queue.ordering.arrived(header.rid)
        if pending.queue_deadline_ns:  # be there when it times out, credits or not
            self.after(timeout_us / 1e6, lambda: self.pump(queue))
        return True

    async def cancel(self, queue: ModelQueue, rid: str) -> None:
        """A client went away: its request leaves the queue (a running batch finishes)."""
        if queue.seq is not None:
            await self.sequences.cancel(queue, rid)
            return
        for pending in queue.requests.remove(lambda p: p.header.rid == rid):
            await self.answers.dropped(queue, pending.header, FailReason.CANCELED)
            return
        for flight in self.flights.waiting(queue.key):  # sent ahead, not started: cancelled as if queued
            for pending in flight.requests:
                if pending.header.rid == rid and rid not in flight.cancelled:
                    flight.cancelled.add(rid)  # its answer, when it comes, is dropped
                    await self.answers.dropped(queue, pending.header, FailReason.CANCELED)
                    return

    def pending(self, queue: ModelQueue) -> int:
        """Requests not started yet: queued here, or sent ahead and waiting at their instance."""
        return queue.pending_count + self.flights.waiting_requests(queue.key)

    async def abandon(self, queue: ModelQueue, message: str) -> None:
        """The version is gone: fail what still waits for it (a drain normally left nothing)."""
        queue.free.clear()
        if queue.seq is not None:
            await self.sequences.abandon(queue, message)
        while queue.requests:
            await self.answers.fail(queue, queue.requests.popleft().header, message)

    # -- batches --------------------------------------------------------------------
    async def pump(self, queue: ModelQueue) -> None:
        """Send what the queue's free credits can take now; be back when a batch is due."""
        if queue.timer is not None:
            queue.timer.cancel()
            queue.timer = None
        if queue.seq is not None:
            await self.sequences.pump(queue)
            return
        await self.drop_expired(queue)
        while queue.free and queue.requests:
            now = time.monotonic()
            decision = next_batch(queue.requests, queue.policy, now)
            if decision.take == 0:
                wake_at = _wake_at(queue, decision.wake_at, now)
                if wake_at is not None:
                    queue.timer = self.after(wake_at - now, lambda: self.pump(queue))
                return
            prefetch = may_prefetch(queue.priorities, self.limiter.enabled, decision)
            slot = self._take_slot(queue, prefetch)
            if slot is None:  # every free instance is running a batch, or held back by the rate limiter:
                return  # a completion (or a release) pumps again
            batch = self._take_requests(queue, decision.take)  # both taken before any await
            if log.isEnabledFor(logging.DEBUG):  # --log-verbose, or the logging extension at run time
                _log_batch(queue, batch, decision.reason)
            await self.dispatch(queue, slot, batch, now, decision.reason)

    async def pump_held_back(self) -> None:
        """Resources were released: every queue the rate limiter held back may run now."""
        if self.limiter.enabled:
            for queue in list(self.queues.values()):
                if queue.free and (queue.requests or (queue.seq is not None and queue.seq.book.queued())):
                    await self.pump(queue)

    def _take_requests(self, queue: ModelQueue, count: int) -> list[Pending]:
        """Up to `count` requests, fewer if their bytes would not fit one bus message."""
        budget = self.nc.max_payload - 64 * 1024 if self.nc.max_payload else 1 << 20
        batch = [queue.requests.popleft()]
        size = len(batch[0].raw)
        while len(batch) < count and queue.requests and size + len(queue.requests[0].raw) <= budget:
            size += len(queue.requests[0].raw)
            batch.append(queue.requests.popleft())
        return batch

    async def drop_expired(self, queue: ModelQueue) -> None:
        """Requests nobody waits for (past their deadline) leave; queue timeouts apply their policy."""
        now_ns = time.time_ns()
        if not queue.requests.due(now_ns):
            return  # the common case: nothing can have expired, and the queue is not read
        expired = queue.requests.remove(lambda p: p.header.deadline_ns <= now_ns)  # before any await
        timed_out = queue.requests.time_out(now_ns, queue.priorities)
        for pending in expired:
            await self.answers.dropped(queue, pending.header, FailReason.REJECTED)
        for pending in timed_out:
            await self.answers.fail(queue, pending.header, "Request timeout expired", FailReason.REJECTED)

    def can_run(self, queue: ModelQueue, slot: Slot) -> bool:
        """Whether the rate limiter lets the slot's instance run a batch now."""
        return self.limiter.can_run(queue.need(slot.instance), slot.worker)

    def _take_slot(self, queue: ModelQueue, prefetch: bool) -> Slot | None:
        """A credit of an instance the rate limiter lets run: preferably one with nothing running
        (only such one unless the batch may be sent ahead, `prefetch.py`), then the fewest batches
        started for its priority, then the oldest credit."""
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
        index = min(candidates)[2]
        slot = queue.free[index]
        del queue.free[index]
        return slot

    async def dispatch(
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
            await self.nc.publish(slot.subject, encode(message))
        except Exception as exc:  # not sent: the credit is still the worker's to use, the requests fail
            log.error("cannot send a batch of '%s' to worker %s: %s", queue.key[0], slot.worker, exc)
            queue.free.appendleft(slot)
            for pending in batch:
                await self.answers.fail(
                    queue, pending.header, f"cannot reach worker {slot.worker}: {type(exc).__name__}"
                )
            return False
        self.flights.start(batch_id, InFlight(queue.key, slot, batch, now))
        self.limiter.acquire(queue.need(slot.instance), slot.worker, (slot.worker, queue.key, slot.instance))
        return True

    def _complete_to(self, batch: list[Pending]) -> str:
        prefix = self._local_prefix
        if prefix and all(p.header.reply.startswith(prefix) for p in batch):
            return self._local_done
        return ""

    def _flight_ended(self, flight: InFlight) -> None:
        queue = self.queue(*flight.key)
        self.limiter.release(queue.need(flight.slot.instance), flight.slot.worker)
        if queue.seq is not None:
            self.sequences.finished(queue, flight)

    # -- for the sequence batcher (`sequences.batcher.Dispatch`) ----------------------
    async def fail(
        self, queue: ModelQueue, header: RequestHeader, message: str, reason: FailReason = FailReason.OTHER
    ) -> None:
        await self.answers.fail(queue, header, message, reason)

    def after(self, delay_s: float, job: Callable[[], Awaitable[Any]]) -> asyncio.TimerHandle:
        return self.tasks.after(delay_s, job)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.tasks.spawn(coro)


def _log_batch(queue: ModelQueue, batch: list[Pending], reason: str) -> None:
    request_ids.set(",".join(p.header.rid for p in batch))
    log.debug(
        "batch of %d request(s), %d row(s) for '%s' version %d: %s; %d still queued",
        len(batch),
        sum(p.batch_size for p in batch),
        queue.key[0],
        queue.key[1],
        reason,
        len(queue.requests),
    )


def _wake_at(queue: ModelQueue, batch_due: float | None, now: float) -> float | None:
    """When a waiting queue must be looked at again (monotonic): its batch's delay, or the first
    request's queue timeout or deadline if sooner (Triton's batcher waits until the closest
    timeout too): a request timing out must leave when it does, so that the requests behind it
    form their batch then, not when the delay ends (issue 28 item 11)."""
    expiry_ns = queue.requests.earliest_expiry_ns()
    expiry = None if expiry_ns is None else now + (expiry_ns - time.time_ns()) / 1e9
    times = [t for t in (batch_due, expiry) if t is not None]
    return min(times) if times else None
