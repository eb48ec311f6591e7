"""Triton's dynamic batcher, and its default scheduler, as one model version's discipline
(`model_queue.Discipline`): requests wait at their priority level under their queue policy
(`queues.py`), and `formation.next_batch` says what goes when a credit is free. The default
scheduler is the same queue with batches of one (`BatchPolicy.dynamic` off, or a
`max_batch_size` of 1), so a reload that adds or removes `dynamic_batching` keeps the queue.
"""

from __future__ import annotations

import logging
import time

from services.scheduler.batching.discipline import Host
from services.scheduler.batching.formation import BatchPolicy, next_batch
from services.scheduler.batching.model_queue import ModelQueue
from services.scheduler.batching.queues import RequestQueue
from services.scheduler.scheduling_records import InFlight, Pending
from services.scheduler.statistics.reasons import FailReason
from shared.config.model_config import ModelSpec
from shared.config.sequence_config import sequence_config
from shared.process.logcontext import request_ids
from shared.wire.records import shown_name

log = logging.getLogger("shoal.scheduler")


def policy_for(spec: ModelSpec | None) -> BatchPolicy:
    if spec is None or spec.dynamic_batching is None:
        return BatchPolicy(spec.max_batch_size if spec else 0)
    db = spec.dynamic_batching
    return BatchPolicy(spec.max_batch_size, db.preferred_batch_sizes, db.max_queue_delay_us / 1e6, True)


class DynamicBatcher:
    def __init__(self, host: Host, spec: ModelSpec | None = None) -> None:
        self.host = host
        self.policy = policy_for(spec)
        self.requests: RequestQueue[Pending] = RequestQueue()

    def adopt(self, spec: ModelSpec) -> bool:
        if sequence_config(spec.config) is not None:
            return False
        self.policy = policy_for(spec)
        return True

    async def retire(self, queue: ModelQueue) -> None:
        """The model is now sequence-batched (a reload): what it queued cannot run there, and is
        answered (never left to its deadline)."""
        while self.requests:
            message = (
                f"model '{shown_name(queue.key[0])}' is now served by the sequence batcher; send the request again"
            )
            await self.host.fail(queue, self.requests.popleft().header, message)

    # -- arrivals -------------------------------------------------------------------
    async def admit(self, queue: ModelQueue, pending: Pending) -> bool:
        policy = queue.priorities.policy(pending.level)
        if policy.max_queue_size and self.requests.size(pending.level) >= policy.max_queue_size:
            await self.host.fail(queue, pending.header, "Exceeds maximum queue size", FailReason.REJECTED)
            return False
        self.requests.append(pending)
        if queue.preserve_ordering:
            queue.ordering.arrived(pending.header.rid)
        if pending.queue_deadline_ns:  # be there when it times out, credits or not
            self.host.after((pending.queue_deadline_ns - time.time_ns()) / 1e9, lambda: self.host.pump(queue))
        return True

    async def cancel(self, queue: ModelQueue, rid: str) -> None:
        """Its request leaves the queue (a running batch finishes)."""
        for pending in self.requests.remove(lambda p: p.header.rid == rid):
            await self.host.dropped(queue, pending.header, FailReason.CANCELED)
            return
        for flight in self.host.waiting(queue.key):  # sent ahead, not started: cancelled as if queued
            for pending in flight.requests:
                if pending.header.rid == rid and rid not in flight.cancelled:
                    flight.cancelled.add(rid)  # its answer, when it comes, is dropped
                    await self.host.dropped(queue, pending.header, FailReason.CANCELED)
                    return

    def queued(self) -> int:
        return len(self.requests)

    def oldest(self) -> float | None:
        return min((p.arrived for p in self.requests), default=None)  # levels and delays: not in arrival order

    def requeue(self, pending: Pending) -> bool:
        self.requests.appendleft(pending)
        return True

    def finished(self, queue: ModelQueue, flight: InFlight) -> None:
        pass  # nothing of it outlives its batch

    async def worker_lost(self, queue: ModelQueue, worker: str, reason: str = "") -> None:
        pass  # its batches are the completion path's (`credits.py`): requeued or failed there

    async def abandon(self, queue: ModelQueue, message: str) -> None:
        while self.requests:
            await self.host.fail(queue, self.requests.popleft().header, message)

    # -- batches --------------------------------------------------------------------
    async def pump(self, queue: ModelQueue) -> None:
        await self.drop_expired(queue)
        while queue.free and self.requests:
            now = time.monotonic()
            decision = next_batch(self.requests, self.policy, now)
            if decision.take == 0:
                wake_at = self._wake_at(decision.wake_at, now)
                if wake_at is not None:
                    queue.timer = self.host.after(wake_at - now, lambda: self.host.pump(queue))
                return
            slot = self.host.take_slot(queue, decision, self.requests[0].header.route)
            if slot is None:  # every free instance is running a batch, or held back by the rate limiter:
                return  # a completion (or a release) pumps again
            batch = self._take_requests(decision.take)  # both taken before any await
            if log.isEnabledFor(logging.DEBUG):  # --log-verbose, or the logging extension at run time
                self._log_batch(queue, batch, decision.reason)
            await self.host.send(queue, slot, batch, now, decision.reason)

    def _take_requests(self, count: int) -> list[Pending]:
        """Up to `count` requests, fewer if their bytes would not fit one bus message."""
        budget = self.host.max_batch_bytes
        requests = self.requests
        batch = [requests.popleft()]
        size = len(batch[0].raw)
        while len(batch) < count and requests and size + len(requests[0].raw) <= budget:
            size += len(requests[0].raw)
            batch.append(requests.popleft())
        return batch

    async def sweep(self, queue: ModelQueue) -> None:
        if self.requests:  # a free credit may be one not used yet (its instance still runs a batch)
            await self.drop_expired(queue)

    async def drop_expired(self, queue: ModelQueue) -> None:
        """Requests nobody waits for (past their deadline) leave; queue timeouts apply their policy."""
        now_ns = time.time_ns()
        if not self.requests.due(now_ns):
            return  # the common case: nothing can have expired, and the queue is not read
        expired = self.requests.remove(lambda p: p.header.deadline_ns <= now_ns)  # before any await
        timed_out = self.requests.time_out(now_ns, queue.priorities)
        for pending in expired:
            await self.host.dropped(queue, pending.header, FailReason.REJECTED)
        for pending in timed_out:
            await self.host.fail(queue, pending.header, "Request timeout expired", FailReason.REJECTED)

    def _wake_at(self, batch_due: float | None, now: float) -> float | None:
        """When a waiting queue must be looked at again (monotonic): its batch's delay, or the first
        request's queue timeout or deadline if sooner (Triton's batcher waits until the closest
        timeout too): a request timing out must leave when it does, so that the requests behind it
        form their batch then, not when the delay ends (issue 28 item 11)."""
        expiry_ns = self.requests.earliest_expiry_ns()
        expiry = None if expiry_ns is None else now + (expiry_ns - time.time_ns()) / 1e9
        times = [t for t in (batch_due, expiry) if t is not None]
        return min(times) if times else None

    def _log_batch(self, queue: ModelQueue, batch: list[Pending], reason: str) -> None:
        request_ids.set(",".join(p.header.rid for p in batch))
        log.debug(
            "batch of %d request(s), %d row(s) for '%s' version %d: %s; %d still queued",
            len(batch),
            sum(p.batch_size for p in batch),
            queue.key[0],
            queue.key[1],
            reason,
            len(self.requests),
        )
