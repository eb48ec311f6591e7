"""Worker credits coming and going: a completed batch returns its credit and its answers,
an idle instance announces one, a reload revokes them, a dead worker takes them along.
Also the bounds of at-most-once messaging: nothing queued or in flight waits forever.

A collaborator of the pump through the small `Pumping` below; it ends flights (`flights.py`)
and gives the answers the scheduler owes (`answers.py`) itself."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Protocol

from services.scheduler.batching.answers import Answers
from services.scheduler.batching.flights import FlightKey, Flights
from services.scheduler.batching.model_queue import ModelQueue
from services.scheduler.scheduling_records import InFlight, Key, Slot
from services.scheduler.statistics.late_first import LateFirstResponses
from shared.wire.messages import CreditsRevoked, InstanceFree

log = logging.getLogger("shoal.scheduler")

FLIGHT_GRACE_S = 5.0  # past the deadline of its last request, a batch still running is given up
EXPIRE_EVERY_S = 1.0


class Pumping(Protocol):
    """What the completion path needs from the pump (`pump.Pump`)."""

    def queue(self, model: str, version: int) -> ModelQueue: ...
    def find(self, key: Key) -> ModelQueue | None: ...
    def all(self) -> list[ModelQueue]: ...
    async def pump(self, queue: ModelQueue) -> None: ...  # send what the queue's credits can take
    async def pump_held_back(self) -> None: ...  # ... for every queue the rate limiter held back
    def ended(self, flight: InFlight) -> None: ...  # a batch ended: its resources return


class Credits:
    def __init__(self, pump: Pumping, flights: Flights, answers: Answers) -> None:
        self.pump = pump
        self.flights = flights
        self.answers = answers
        self.late_first = LateFirstResponses()  # decoupled requests whose first response comes later

    def _end(self, key: FlightKey) -> InFlight | None:
        """End a flight once (None if it ended already), and let the pump take back what it held."""
        flight = self.flights.end(key)
        if flight is not None:
            self.pump.ended(flight)
        return flight

    async def on_free(self, free: InstanceFree) -> None:
        """A batch completed (its answers, its credit back), or an idle credit announced."""
        queue = self.pump.queue(free.model, free.version)
        if free.batch_id >= 0:
            await self._complete(queue, free)
        if free.instance >= 0:
            slot = Slot(free.worker, free.instance, free.credit, free.subject, free.generation, free.local)
            # a bare announcement for a credit now in flight is stale (sent before the batch
            # arrived): that batch's completion returns the credit
            stale = free.batch_id < 0 and self.flights.holds(slot)
            if not stale and slot not in queue.free:
                queue.free.append(slot)
        await self.pump.pump(queue)
        await self.pump.pump_held_back()

    async def _complete(self, queue: ModelQueue, free: InstanceFree) -> None:
        if not self.flights.mine(free.worker, free.batch_id, queue.key):
            return  # another replica's batch
        flight = self.flights.end((free.worker, free.batch_id))  # as `_end` does, written out: the hot path
        if flight is None:
            return
        for done in free.done:  # before the discipline hears the batch ended: these go back to it
            if done.rescheduled:
                flight.rescheduled.add(done.rid)
        self.pump.ended(flight)
        now_ns = time.time_ns()
        headers = {p.header.rid: p.header for p in flight.live}
        decoupled = queue.spec is not None and queue.spec.decoupled
        if free.batch_size:
            self._record_batch(queue, free, flight)
        for done in free.done:
            header = headers.pop(done.rid, None)
            if header is None or done.rescheduled:  # (a rescheduled request is queued again, unanswered)
                continue
            duration = now_ns - header.received_ns
            if not decoupled:  # its one response ends it
                queue.stats.record_request(done.ok, duration)
            else:  # the model answered itself, and its worker said when first (if it had by the end of execute)
                first = done.first_response_ns - header.received_ns
                queue.stats.record_request(
                    done.ok, duration, first_response_ns=first, responded=bool(done.first_response_ns)
                )
                if not done.first_response_ns:  # it answers later (a thread, an engine): the worker will say
                    self.late_first.expect(done.rid, queue.stats, header.received_ns)
            await self.answers.finish(queue, header, done.response or None)
        for header in headers.values():  # the worker did not report them: fail, never lose
            await self.answers.fail(queue, header, f"request was lost by worker {free.worker}")

    @staticmethod
    def _record_batch(queue: ModelQueue, free: InstanceFree, flight: InFlight) -> None:
        """The execution in Triton's statistics as Triton would have run it: without the requests
        cancelled while they waited at the instance (they count as CANCELED, never as executed);
        the instance's utilisation counts all it did."""
        stats = queue.stats
        busy = free.compute_input_ns + free.compute_infer_ns + free.compute_output_ns
        stats.worker_compute_ns[free.worker] = stats.worker_compute_ns.get(free.worker, 0) + busy
        stats.worker_executions[free.worker] = stats.worker_executions.get(free.worker, 0) + 1
        ran = {d.rid for d in free.done if d.ok}
        ok_count = sum(1 for rid in ran if rid not in flight.cancelled)
        rows = free.batch_size - sum(p.batch_size for p in flight.requests if p.header.rid in flight.cancelled & ran)
        if rows > 0:
            stats.record_batch(rows, ok_count, free.compute_input_ns, free.compute_infer_ns, free.compute_output_ns)

    async def revoked(self, revoked: CreditsRevoked) -> None:
        """The worker reloaded or unloaded the instances of one generation: their credits are void."""
        queue = self.pump.find((revoked.model, revoked.version))
        if queue is None:
            return
        queue.free = deque(
            s for s in queue.free if not (s.worker == revoked.worker and s.generation == revoked.generation)
        )
        queue.router.forget(lambda target: target[0] == revoked.worker)  # the new instances start empty
        # the instances holding state for it (a sequence's) are gone
        reason = f"its instances on worker {revoked.worker} were reloaded or unloaded"
        await queue.discipline.worker_lost(queue, revoked.worker, reason)
        await self.pump.pump(queue)

    async def worker_lost(self, worker: str) -> None:
        log.warning("worker %s is gone; failing its in-flight requests", worker)
        queues = self.pump.all()
        for queue in queues:
            queue.free = deque(s for s in queue.free if s.worker != worker)
            queue.router.forget(lambda target: target[0] == worker)
        for queue in queues:  # before its flights end: freed slots must not go to backlogged sequences
            await queue.discipline.worker_lost(queue, worker)
        await self._recover_flights(worker)

    async def _recover_flights(self, worker: str) -> None:
        """The batches a lost worker held. The oldest of each instance was running (it may be
        what killed the worker): its requests fail. The later ones waited behind it, never
        started: requests safe to run again (not in a sequence, not for a decoupled model,
        before their deadline, not retried yet) go back to the head of their queue for another
        instance; the rest fail (docs/reliability.md, metric shoal_inference_request_retry)."""
        keys = sorted(self.flights.of_worker(worker), key=lambda k: k[1])  # batch ids grow: sending order
        started: set[tuple[tuple[str, int], int]] = set()
        requeued: dict[Key, ModelQueue] = {}
        now_ns = time.time_ns()
        for key in keys:
            flight = self._end(key)
            if flight is None:
                continue
            queue = self.pump.queue(*flight.key)
            instance = (flight.key, flight.slot.instance)
            waited = instance in started  # another batch of its instance was sent before it
            started.add(instance)
            reason = f"worker {worker} stopped responding while running the request"
            if await self._requeue_or_fail(queue, flight, waited, now_ns, reason):
                requeued[queue.key] = queue
        for queue in requeued.values():
            log.warning("requests of '%s' that worker %s had not started go to another instance", queue.key[0], worker)
            await self.pump.pump(queue)

    async def _requeue_or_fail(
        self, queue: ModelQueue, flight: InFlight, unstarted: bool, now_ns: int, reason: str
    ) -> bool:
        """A batch of `flight` that never ran: each request safe to run again (the batch did not
        start, not in a sequence, not for a decoupled model, before its deadline, not retried yet)
        goes back to the head of its queue; the others fail with `reason`. True if any went back."""
        safe = unstarted and not (queue.spec and queue.spec.decoupled)
        back = False
        for pending in reversed(flight.live):  # to the head, one by one: they keep their order
            if (
                safe
                and not pending.retried
                and pending.header.deadline_ns > now_ns
                and queue.discipline.requeue(pending)  # not a sequence's
            ):
                pending.retried = True
                queue.stats.retries += 1
                back = True
            else:
                await self.answers.fail(queue, pending.header, reason)
        return back

    async def lost_in_transit(self, worker: str, holding: set[int], cutoff: float) -> int:
        """The worker's NATS connection dropped and is back: the batches sent to it before `cutoff`
        that it does not hold were lost on the way (or their completion was). None of them runs
        there now, so each request safe to run again goes back to the head of its queue and the
        others fail; the credit is the worker's again. Returns how many batches ended."""
        ended = 0
        requeued: dict[Key, ModelQueue] = {}
        now_ns = time.time_ns()
        for key in self.flights.sent_before(worker, cutoff):
            if key[1] in holding:
                continue
            flight = self._end(key)
            if flight is None:
                continue
            ended += 1
            queue = self.pump.queue(*flight.key)
            reason = f"the batch was lost when worker {worker}'s connection to NATS dropped"
            await self._requeue_or_fail(queue, flight, True, now_ns, reason)
            if flight.slot not in queue.free:
                queue.free.append(flight.slot)
            requeued[queue.key] = queue
        for queue in requeued.values():
            await self.pump.pump(queue)
        if ended:
            log.warning("%d batch(es) sent to worker %s were lost with its NATS connection", ended, worker)
        return ended

    async def expire_forever(self) -> None:
        while True:
            await asyncio.sleep(EXPIRE_EVERY_S)
            await self.expire()

    async def expire(self) -> None:
        """Queued requests past their deadline leave even with no credit to wake the queue, and
        a batch whose completion never came is failed (its requests are past their deadline by
        then) and its credit returned."""
        for queue in self.pump.all():
            await queue.discipline.sweep(queue)
        cutoff = time.time_ns() - int(FLIGHT_GRACE_S * 1e9)
        for key in self.flights.overdue(cutoff):
            flight = self._end(key)
            if flight is None:
                continue
            queue = self.pump.queue(*flight.key)
            log.warning("batch %d of '%s' on worker %s never completed; failing it", key[1], flight.key[0], key[0])
            for pending in flight.live:
                await self.answers.fail(queue, pending.header, "the request was lost on its way to or from a worker")
            if flight.slot not in queue.free:
                queue.free.append(flight.slot)
            await self.pump.pump(queue)
