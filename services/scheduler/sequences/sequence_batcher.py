"""Triton's sequence batcher as one model version's discipline (`batching.model_queue.Discipline`):
glue between `SequenceBook` (slots, backlog, idle), `selection.decide` (what runs now) and the
pump (`batching.discipline.Host`), which sends the batches.

A sequence request's controls travel in `ExecBatch.controls` (a small struct per request);
the worker builds the control tensors and keeps implicit state, the scheduler never
touches tensor bytes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

from services.scheduler.batching.discipline import Host
from services.scheduler.batching.model_queue import ModelQueue
from services.scheduler.scheduling_records import CorrId, InFlight, Pending, Sequence, SlotKey
from services.scheduler.sequences.book import SequenceBook
from services.scheduler.sequences.selection import decide
from services.scheduler.statistics.reasons import FailReason
from shared.config.model_config import ModelSpec
from shared.config.sequence_config import CORRID, SequenceConfig, sequence_config
from shared.errors import Code
from shared.wire import subjects
from shared.wire.messages import InferResponse, RequestHeader, SeqControl, SequenceEnded, encode
from shared.wire.records import shown_name

log = logging.getLogger("shoal.scheduler.sequences")

Publish = Callable[[str, bytes], Awaitable[None]]
# correlation ids an iterative sequence batcher gives requests that have none (core counts from 1;
# these stay clear of the ids clients choose, and fit a UINT64 CORRID control)
ITERATIVE_IDS_FROM = 1 << 62


class SequenceBatcher:
    def __init__(self, host: Host, publish: Publish, model: str, config: SequenceConfig) -> None:
        self.host = host
        self.publish = publish  # answers to clients, and `SequenceEnded` to workers
        self.config = config
        self.book = SequenceBook(model, config.slots_per_instance, config.idle_us / 1e6)
        self.reaper: asyncio.TimerHandle | None = None  # the next idle check
        self.retired = False
        self._iterative_ids = itertools.count(ITERATIVE_IDS_FROM)

    def adopt(self, spec: ModelSpec) -> bool:
        """A reload with the same slots keeps the live sequences; other slots end them."""
        config = sequence_config(spec.config)
        if config is None or config.slots_per_instance != self.config.slots_per_instance:
            return False
        self.config = config
        self.book.idle_s = config.idle_us / 1e6
        return True

    async def retire(self, queue: ModelQueue) -> None:
        """The model's slots changed (a reload): its live sequences end; what they queued is
        answered, and workers free what they held for them."""
        self.retired = True
        if self.reaper is not None:
            self.reaper.cancel()
        for seq, pending in self.book.all_queued():
            seq.queue.remove(pending)
            await self._error(
                queue,
                pending.header,
                f"sequence {seq.corrid} to model '{shown_name(queue.key[0])}' was lost: the "
                "model was reloaded; start it again with the START flag",
                Code.UNAVAILABLE,
            )
        for slot, seq in list(self.book.bound.items()):
            await self._tell_worker(queue, seq, slot, "model reloaded")

    def queued(self) -> int:
        return self.book.queued()

    def oldest(self) -> float | None:
        return min((pending.arrived for _, pending in self.book.all_queued()), default=None)

    def requeue(self, pending: Pending) -> bool:
        return False  # a sequence's request never runs twice: its state may have moved on

    async def sweep(self, queue: ModelQueue) -> None:
        """Requests past their deadline leave their sequence (the gateway gave up on them): dead
        STARTs must not hold slots or places in the backlog."""
        now_ns = time.time_ns()
        for seq, pending, slot in self.book.expire(lambda p: p.header.deadline_ns <= now_ns, time.monotonic()):
            queue.stats.record_request(False, now_ns - pending.header.received_ns, FailReason.REJECTED)
            if slot is not None and seq.slot is None and seq.ran:  # ended here: the worker frees its state
                await self._tell_worker(queue, seq, slot, "expired")
        await self.host.pump(queue)

    # -- arrivals -------------------------------------------------------------------
    async def admit(self, queue: ModelQueue, pending: Pending) -> bool:
        """Queue a request in its sequence, or answer it with Triton's error."""
        header, model, book = pending.header, queue.key[0], self.book
        if self.config.iterative and header.sequence_id in (0, ""):
            # core's IterativeSequencer: a request without a correlation id starts a sequence of its own
            header.sequence_id = next(self._iterative_ids)
            header.sequence_start, header.sequence_end = True, False
        refused = _refusal(queue, self.config, header)
        if refused:
            await self._error(queue, header, refused, Code.INVALID_ARG)
            return False
        admission = book.admit(header.sequence_id, header.sequence_start, header.sequence_end, pending, pending.arrived)
        if admission.sequence is None:
            log.debug(
                "refused a request of sequence %r for '%s': %d live sequence(s), %d backlogged",
                header.sequence_id,
                model,
                len(book.live),
                len(book.backlog),
            )
            await self._error(queue, header, admission.error, Code.INVALID_ARG)
            return False
        if admission.conflict:
            log.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end before this "
                "sequence start. Previous sequence will be terminated early.",
                header.sequence_id,
                model,
            )
        pending.sequence = admission.sequence
        if header.timeout_us and admission.sequence.slot is None and self.config.strategy == "direct":
            # the request `timeout` applies while the sequence waits in the backlog (Triton, direct)
            pending.queue_deadline_ns = time.time_ns() + header.timeout_us * 1000
            self.host.after(header.timeout_us / 1e6 + 0.001, lambda: self._expire_backlog(queue))
        self._arm_reaper(queue)
        return True

    async def _expire_backlog(self, queue: ModelQueue) -> None:
        if self.retired:
            return
        now_ns = time.time_ns()
        for seq in self.book.expire_backlog(lambda p: 0 < p.queue_deadline_ns <= now_ns):
            while seq.queue:
                await self.host.fail(queue, seq.queue.popleft().header, "Request timeout expired", FailReason.REJECTED)

    # -- dispatch -------------------------------------------------------------------
    async def pump(self, queue: ModelQueue) -> None:
        book = self.book
        now = time.monotonic()
        for credit in queue.free:
            book.learn(credit.worker, credit.instance, now)
        wake: float | None = None
        for credit in list(queue.free):
            if credit not in queue.free:  # taken by a pump that ran while this one awaited a send
                continue
            if not self.host.can_run(queue, credit):
                continue  # the rate limiter holds this instance back; a release pumps again
            ready = book.ready(credit.worker, credit.instance)
            if not ready:
                continue
            decision = decide(self.config, ready, now)
            if not decision.take:
                if decision.wake_at is not None:
                    wake = decision.wake_at if wake is None else min(wake, decision.wake_at)
                continue
            queue.free.remove(credit)
            batch = [seq.queue[0] for seq in decision.take]
            controls: list[SeqControl] = []
            for seq, pending in zip(decision.take, batch):
                book.started(seq, pending, now)
                assert seq.slot is not None  # a ready sequence holds a slot
                h = pending.header
                controls.append(
                    SeqControl(
                        corrid=seq.corrid, seq=seq.seq, start=h.sequence_start, end=h.sequence_end, slot=seq.slot[2]
                    )
                )
            if not await self.host.send(queue, credit, batch, now, decision.reason, controls):
                for seq in decision.take:  # not sent (the requests were failed): the sequences go on
                    book.finished(seq, now)
        if wake is not None:
            queue.timer = self.host.after(wake - now, lambda: self.host.pump(queue))
        self._arm_reaper(queue)

    def finished(self, queue: ModelQueue, flight: InFlight) -> None:
        """A batch ended (completed, expired, or its worker died): its sequences may go on.
        Iterative sequences (core's IterativeSequencer): a request the model rescheduled goes back
        to the head of its sequence, neither START nor END now; one released otherwise ends its
        sequence, and the worker frees what it held for it."""
        now = time.monotonic()
        for pending in flight.requests:
            seq = pending.sequence
            if seq is None:
                continue
            if pending.header.rid in flight.rescheduled:
                pending.header.sequence_start = pending.header.sequence_end = False
                seq.queue.appendleft(pending)
            elif self.config.iterative and not seq.closing:
                seq.closing = True
                slot = seq.slot
                if slot is not None and not seq.queue:
                    self.host.spawn(self._tell_worker(queue, seq, slot, "released"))
            self.book.finished(seq, now)

    # -- endings --------------------------------------------------------------------
    async def cancel(self, queue: ModelQueue, rid: str) -> None:
        book = self.book
        for seq, pending in book.all_queued():
            if pending.header.rid != rid:
                continue
            slot = seq.slot
            book.remove(seq, pending, time.monotonic())
            # counted, and answered CANCELLED as Triton's sequence batcher finishes it: a python model
            # that cancelled its BLS stream reads on until that answer (its client's gateway drops it)
            await self.host.dropped(queue, pending.header, FailReason.CANCELED)
            if slot is not None and seq.slot is None:  # its END will never reach the worker
                await self._tell_worker(queue, seq, slot, "cancelled")
        await self.host.pump(queue)

    async def worker_lost(self, queue: ModelQueue, worker: str, reason: str = "") -> None:
        """The worker died, or retired the instances (reload, unload): their sequences are lost."""
        reason = reason or f"worker {worker} stopped responding"
        for seq in self.book.forget_worker(worker, reason):
            await self._answer_queued(
                queue, seq, f"sequence {seq.corrid} to model '{shown_name(queue.key[0])}' was lost: {reason}"
            )
        await self.host.pump(queue)

    async def abandon(self, queue: ModelQueue, message: str) -> None:
        book = self.book
        for seq, pending in book.all_queued():
            seq.queue.remove(pending)
            await self.host.fail(queue, pending.header, message)
        for slot, seq in list(book.bound.items()):  # workers free what they hold for them
            await self._tell_worker(queue, seq, slot, "no longer served by this scheduler")

    async def restart(self, queue: ModelQueue, reason: str) -> list[CorrId]:
        """A hand-over's residue ends: what its sequences queued is answered, workers free their
        state, and the book starts afresh, remembering the lost ids (their later requests say why)."""
        book = self.book
        lost = []
        for seq in list(book.bound.values()) + list(book.backlog):
            if book.live.get(seq.corrid) is seq:
                lost.append(seq.corrid)
            await self._answer_queued(
                queue,
                seq,
                f"sequence {seq.corrid} to model '{shown_name(queue.key[0])}' was lost: {reason}; start it again with the START flag",
            )
            if seq.slot is not None:
                await self._tell_worker(queue, seq, seq.slot, "no longer served by this scheduler")
        config = self.config
        self.book = SequenceBook(queue.key[0], config.slots_per_instance, config.idle_us / 1e6)
        self.book.lose(lost, reason)
        return lost

    def _arm_reaper(self, queue: ModelQueue) -> None:
        when = self.book.next_idle_at()
        if self.reaper is not None:
            self.reaper.cancel()
            self.reaper = None
        if when is not None:
            delay = max(0.0, when - time.monotonic()) + 0.001
            self.reaper = self.host.after(delay, lambda: self._reap(queue))

    async def _reap(self, queue: ModelQueue) -> None:
        if self.retired:
            return
        self.reaper = None
        idle_us = self.config.idle_us
        for seq, slot in self.book.idle(time.monotonic()):
            log.info(
                "sequence %s of model '%s' idle for %d us: its slot is released", seq.corrid, queue.key[0], idle_us
            )
            await self._answer_queued(
                queue,
                seq,
                f"sequence {seq.corrid} to model '{shown_name(queue.key[0])}' timed out: no "
                f"request for {idle_us} us (max_sequence_idle_microseconds)",
            )
            await self._tell_worker(queue, seq, slot, "idle timeout")
        await self.host.pump(queue)  # backlogged sequences may have got the freed slots

    async def _tell_worker(self, queue: ModelQueue, seq: Sequence, slot: SlotKey, reason: str) -> None:
        """The worker frees what it holds for the sequence (implicit state; python models are told)."""
        ended = SequenceEnded(
            model=queue.key[0], version=queue.key[1], instance=slot[1], corrid=seq.corrid, seq=seq.seq, reason=reason
        )
        try:
            await self.publish(subjects.worker_sequence(slot[0]), encode(ended))
        except Exception as exc:  # the worker drops state of a restarted sequence at START anyway
            log.warning("cannot tell worker %s that sequence %s ended: %s", slot[0], seq.corrid, exc)

    async def _answer_queued(self, queue: ModelQueue, seq: Sequence, message: str) -> None:
        """The sequence ended here: every request it still queued is answered with why."""
        while seq.queue:
            await self._error(queue, seq.queue.popleft().header, message, Code.UNAVAILABLE)

    async def _error(self, queue: ModelQueue, header: RequestHeader, message: str, code: Code) -> None:
        # Triton's failure reasons: a refused request is OTHER, one the server gave up on REJECTED
        reason = FailReason.OTHER if code == Code.INVALID_ARG else FailReason.REJECTED
        queue.stats.record_request(False, time.time_ns() - header.received_ns, reason)
        await self.publish(header.reply, encode(InferResponse(header.rid, error=message, code=code)))


def _refusal(queue: ModelQueue, config: SequenceConfig, header: RequestHeader) -> str:
    """Triton's error for a request the sequence batcher cannot take at all, or ''."""
    model = shown_name(queue.key[0])
    if header.batch_size > 1 and queue.spec is not None and queue.spec.max_batch_size > 0:
        return f"inference request to model '{model}' must specify batch-size 1 due to requirements of sequence batcher"
    if header.sequence_id in (0, ""):  # (an iterative batcher gave it one already)
        return f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID"
    corrid = config.control(CORRID)
    if corrid is not None and (corrid.datatype == "BYTES") != isinstance(header.sequence_id, str):
        wanted = "a string" if corrid.datatype == "BYTES" else "an unsigned integer"
        return (
            f"inference request to model '{model}' must specify {wanted} correlation "
            f"ID: its CORRID control is {corrid.datatype}"
        )
    return ""


def sequence_batcher_of(queue: ModelQueue) -> SequenceBatcher | None:
    """The queue's sequence batcher if its model is sequence-batched (for what concerns live
    sequences only: the hand-over, usage, status), else None."""
    discipline = queue.discipline
    return discipline if isinstance(discipline, SequenceBatcher) else None
