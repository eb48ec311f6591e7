"""The sequence batcher inside the scheduler service: glue between `SequenceBook` (slots,
backlog, idle), `sequence_batch.decide` (what runs now) and the service's dispatch.

Hooked into `SchedulerService` at a few points only (admit, pump, flight finished,
cancel, worker lost, abandon), so the service's dynamic-batching path is untouched.
A sequence request's controls travel in `ExecBatch.controls` (a small struct per request);
the worker builds the control tensors and keeps implicit state, the scheduler never
touches tensor bytes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.scheduler.sequences.book import Sequence, SequenceBook, SlotKey
from services.scheduler.sequences.selection import decide
from shared import subjects
from shared.messages import InferResponse, RequestHeader, SeqControl, SequenceEnded, encode
from shared.sequence_config import CORRID, SequenceConfig, sequence_config

if TYPE_CHECKING:
    from services.scheduler.service import InFlight, ModelQueue, Pending, SchedulerService

log = logging.getLogger("shoal.scheduler.sequences")


@dataclass
class SequenceQueue:
    config: SequenceConfig
    book: SequenceBook
    reaper: object | None = None  # asyncio.TimerHandle of the next idle check


class Sequencer:
    def __init__(self, service: SchedulerService) -> None:
        self.service = service

    def configure(self, queue: ModelQueue) -> None:
        config = sequence_config(queue.spec.config) if queue.spec is not None else None
        old = queue.seq
        if config is None:
            queue.seq = None
        elif queue.seq is None or queue.seq.config.slots_per_instance != config.slots_per_instance:
            queue.seq = SequenceQueue(
                config, SequenceBook(queue.key[0], config.slots_per_instance, config.idle_us / 1e6)
            )
        else:  # a reload with the same slots keeps the live sequences
            queue.seq.config = config
            queue.seq.book.idle_s = config.idle_us / 1e6
        if old is not None and queue.seq is not old:
            self.service._spawn(self._retire(queue, old))

    async def _retire(self, queue: ModelQueue, old: SequenceQueue) -> None:
        """The model's slots changed (a reload): its live sequences end; what they queued is
        answered, and workers free what they held for them."""
        if old.reaper is not None:
            old.reaper.cancel()
        for seq, pending in old.book.all_queued():
            seq.queue.remove(pending)
            await self._error(
                queue,
                pending.header,
                f"sequence {seq.corrid} to model '{queue.key[0]}' was lost: the "
                "model was reloaded; start it again with the START flag",
                "UNAVAILABLE",
            )
        for slot, seq in list(old.book.bound.items()):
            await self._tell_worker(queue, seq, slot, "model reloaded")

    async def expire(self, queue: ModelQueue) -> None:
        """Requests past their deadline leave their sequence (the gateway gave up on them): dead
        STARTs must not hold slots or places in the backlog."""
        now_ns = time.time_ns()
        for seq, pending, slot in queue.seq.book.expire(lambda p: p.header.deadline_ns <= now_ns, time.monotonic()):
            queue.stats.record_request(False, now_ns - pending.header.received_ns, "REJECTED")
            if slot is not None and seq.slot is None and seq.ran:  # ended here: the worker frees its state
                await self._tell_worker(queue, seq, slot, "expired")

    # -- arrivals -------------------------------------------------------------------
    async def admit(self, queue: ModelQueue, pending: Pending) -> bool:
        """Queue a request in its sequence, or answer it with Triton's error."""
        header, model = pending.header, queue.key[0]
        if header.batch_size > 1 and queue.spec.max_batch_size > 0:
            await self._error(
                queue,
                header,
                f"inference request to model '{model}' must specify batch-size 1 due to "
                "requirements of sequence batcher",
                "INVALID_ARG",
            )
            return False
        if header.sequence_id in (0, ""):
            await self._error(
                queue,
                header,
                f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID",
                "INVALID_ARG",
            )
            return False
        corrid = queue.seq.config.control(CORRID)
        if corrid is not None and (corrid.datatype == "BYTES") != isinstance(header.sequence_id, str):
            wanted = "a string" if corrid.datatype == "BYTES" else "an unsigned integer"
            await self._error(
                queue,
                header,
                f"inference request to model '{model}' must specify {wanted} correlation "
                f"ID: its CORRID control is {corrid.datatype}",
                "INVALID_ARG",
            )
            return False
        admission = queue.seq.book.admit(
            header.sequence_id, header.sequence_start, header.sequence_end, pending, pending.arrived
        )
        if admission.sequence is None:
            log.debug(
                "refused a request of sequence %r for '%s': %d live sequence(s), %d backlogged",
                header.sequence_id,
                model,
                len(queue.seq.book.live),
                len(queue.seq.book.backlog),
            )
            await self._error(queue, header, admission.error, "INVALID_ARG")
            return False
        if admission.conflict:
            log.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                "sequence start. Previous sequence will be terminated early.",
                header.sequence_id,
                model,
            )
        pending.sequence = admission.sequence
        if header.timeout_us and admission.sequence.slot is None and queue.seq.config.strategy == "direct":
            # the request `timeout` applies while the sequence waits in the backlog (Triton, direct)
            pending.queue_deadline_ns = time.time_ns() + header.timeout_us * 1000
            self.service._loop.call_later(
                header.timeout_us / 1e6 + 0.001, lambda q=queue: self.service._spawn(self._expire_backlog(q))
            )
        self._arm_reaper(queue)
        return True

    async def _expire_backlog(self, queue: ModelQueue) -> None:
        if queue.seq is None:
            return
        now_ns = time.time_ns()
        for seq in queue.seq.book.expire_backlog(lambda p: 0 < p.queue_deadline_ns <= now_ns):
            while seq.queue:
                await self.service._fail(queue, seq.queue.popleft().header, "Request timeout expired", "REJECTED")

    # -- dispatch -------------------------------------------------------------------
    async def pump(self, queue: ModelQueue) -> None:
        seq_queue, book = queue.seq, queue.seq.book
        now = time.monotonic()
        for credit in queue.free:
            book.learn(credit.worker, credit.instance, now)
        wake: float | None = None
        for credit in list(queue.free):
            if credit not in queue.free:  # taken by a pump that ran while this one awaited a dispatch
                continue
            if not self.service.limiter.can_run(queue.need(credit.instance), credit.worker):
                continue  # the rate limiter holds this instance back; a release pumps again
            ready = book.ready(credit.worker, credit.instance)
            if not ready:
                continue
            decision = decide(seq_queue.config, ready, now)
            if not decision.take:
                if decision.wake_at is not None:
                    wake = decision.wake_at if wake is None else min(wake, decision.wake_at)
                continue
            queue.free.remove(credit)
            batch = [seq.queue[0] for seq in decision.take]
            controls = []
            for seq, pending in zip(decision.take, batch):
                book.started(seq, pending, now)
                h = pending.header
                controls.append(
                    SeqControl(
                        corrid=seq.corrid, seq=seq.seq, start=h.sequence_start, end=h.sequence_end, slot=seq.slot[2]
                    )
                )
            if not await self.service._dispatch(queue, credit, batch, now, decision.reason, controls):
                for seq in decision.take:  # not sent (the requests were failed): the sequences go on
                    book.finished(seq, now)
        if wake is not None:
            loop = self.service._loop
            queue.timer = loop.call_at(
                loop.time() + (wake - now), lambda q=queue: self.service._spawn(self.service._pump(q))
            )
        self._arm_reaper(queue)

    def finished(self, queue: ModelQueue, flight: InFlight) -> None:
        """A batch ended (completed, expired, or its worker died): its sequences may go on."""
        now = time.monotonic()
        for pending in flight.requests:
            if pending.sequence is not None:
                queue.seq.book.finished(pending.sequence, now)

    # -- endings --------------------------------------------------------------------
    async def cancel(self, queue: ModelQueue, rid: str) -> None:
        book = queue.seq.book
        for seq, pending in book.all_queued():
            if pending.header.rid != rid:
                continue
            slot = seq.slot
            book.remove(seq, pending, time.monotonic())
            queue.stats.record_request(False, time.time_ns() - pending.header.received_ns, "CANCELED")
            if slot is not None and seq.slot is None:  # its END will never reach the worker
                await self._tell_worker(queue, seq, slot, "cancelled")
        await self.service._pump(queue)

    async def worker_lost(self, queue: ModelQueue, worker: str, reason: str = "") -> None:
        """The worker died, or retired the instances (reload, unload): their sequences are lost."""
        reason = reason or f"worker {worker} stopped responding"
        for seq in queue.seq.book.forget_worker(worker, reason):
            while seq.queue:
                pending = seq.queue.popleft()
                await self._error(
                    queue,
                    pending.header,
                    f"sequence {seq.corrid} to model '{queue.key[0]}' was lost: {reason}",
                    "UNAVAILABLE",
                )
        await self.service._pump(queue)

    async def abandon(self, queue: ModelQueue, message: str) -> None:
        for seq, pending in queue.seq.book.all_queued():
            seq.queue.remove(pending)
            await self.service._fail(queue, pending.header, message)
        for slot, seq in list(queue.seq.book.bound.items()):  # workers free what they hold for them
            await self._tell_worker(queue, seq, slot, "no longer served by this scheduler")

    def _arm_reaper(self, queue: ModelQueue) -> None:
        seq_queue = queue.seq
        when = seq_queue.book.next_idle_at()
        if seq_queue.reaper is not None:
            seq_queue.reaper.cancel()
            seq_queue.reaper = None
        if when is not None:
            loop = self.service._loop
            delay = max(0.0, when - time.monotonic()) + 0.001
            seq_queue.reaper = loop.call_later(delay, lambda q=queue: self.service._spawn(self._reap(q)))

    async def _reap(self, queue: ModelQueue) -> None:
        if queue.seq is None:
            return
        queue.seq.reaper = None
        idle_us = queue.seq.config.idle_us
        for seq, slot in queue.seq.book.idle(time.monotonic()):
            log.info(
                "sequence %s of model '%s' idle for %d us: its slot is released", seq.corrid, queue.key[0], idle_us
            )
            while seq.queue:
                pending = seq.queue.popleft()
                await self._error(
                    queue,
                    pending.header,
                    f"sequence {seq.corrid} to model '{queue.key[0]}' timed out: no "
                    f"request for {idle_us} us (max_sequence_idle_microseconds)",
                    "UNAVAILABLE",
                )
            await self._tell_worker(queue, seq, slot, "idle timeout")
        await self.service._pump(queue)  # backlogged sequences may have got the freed slots

    async def _tell_worker(self, queue: ModelQueue, seq: Sequence, slot: SlotKey, reason: str) -> None:
        """The worker frees what it holds for the sequence (implicit state; python models are told)."""
        ended = SequenceEnded(
            model=queue.key[0], version=queue.key[1], instance=slot[1], corrid=seq.corrid, seq=seq.seq, reason=reason
        )
        try:
            await self.service.nc.publish(subjects.worker_sequence(slot[0]), encode(ended))
        except Exception as exc:  # the worker drops state of a restarted sequence at START anyway
            log.warning("cannot tell worker %s that sequence %s ended: %s", slot[0], seq.corrid, exc)

    async def _error(self, queue: ModelQueue, header: RequestHeader, message: str, code: str) -> None:
        # Triton's failure reasons: a refused request is OTHER, one the server gave up on REJECTED
        reason = "OTHER" if code == "INVALID_ARG" else "REJECTED"
        queue.stats.record_request(False, time.time_ns() - header.received_ns, reason)
        await self.service.nc.publish(header.reply, encode(InferResponse(header.rid, error=message, code=code)))
