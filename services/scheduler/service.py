"""The scheduler: per-model-version queues, batch formation, dispatch on worker credits.

Requests arrive from gateways on `shoal.infer.<model>`. Only their header is
decoded; the original bytes are forwarded in the batch. A worker grants one credit
per free instance (`InstanceFree`); when a queue has work and a credit, the batcher
decides what to send. Completion messages carry the timings the statistics need.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from services.scheduler.batching.batcher import BatchPolicy, next_batch
from services.scheduler.batching.ordering import OrderedRelease
from services.scheduler.batching.queues import Priorities, RequestQueue
from services.scheduler.batching.ratelimit import Need, RateLimiter, instance_needs, parse_resources
from services.scheduler.ensembles.runner import EnsembleRunner
from services.scheduler.replicas.handover import RESIDUE_MAX_S, SHUTDOWN_RESIDUE_S, HandOver
from services.scheduler.replicas.leases import TTL_S as LEASE_TTL_S
from services.scheduler.replicas.leases import Leases
from services.scheduler.sequences.batcher import SequenceQueue, Sequencer
from services.scheduler.statistics.stats import ModelStats
from shared import bus, discovery, subjects
from shared.liveness import WorkerLiveness
from shared.logcontext import request_ids
from shared.messages import (
    CacheEvent,
    CancelRequest,
    CreditsRevoked,
    DrainRequest,
    ExecBatch,
    InferResponse,
    InstanceFree,
    ModelRecord,
    RequestBatch,
    RequestHeader,
    encode,
)
from shared.model_config import ModelSpec, spec_from_json
from shared.runtime import serve_until
from shared.settings import SchedulerSettings

log = logging.getLogger("shoal.scheduler")

HANDOVER_S = 2.0  # a model changing replicas is served by both for this long
HANDOVER_DRAIN_S = 10.0  # then the old owner finishes what it queued, for at most this long
FLIGHT_GRACE_S = 5.0  # past the deadline of its last request, a batch still running is given up
_header_decoder = msgspec.msgpack.Decoder(RequestHeader)
_batch_decoder = msgspec.msgpack.Decoder(RequestBatch)
_revoked_decoder = msgspec.msgpack.Decoder(CreditsRevoked)
_drain_decoder = msgspec.msgpack.Decoder(DrainRequest)
_cancel_decoder = msgspec.msgpack.Decoder(CancelRequest)
_cache_decoder = msgspec.msgpack.Decoder(CacheEvent)
_free_decoder = msgspec.msgpack.Decoder(InstanceFree)
_record_decoder = msgspec.msgpack.Decoder(ModelRecord)


@dataclass
class Pending:
    header: RequestHeader
    raw: msgspec.Raw  # the request exactly as the gateway encoded it
    arrived: float  # monotonic
    enqueued_ns: int = 0  # CLOCK_MONOTONIC, for traces
    level: int = 0  # priority level (0: the model has one queue)
    queue_deadline_ns: int = 0  # queue policy timeout, wall clock; 0 = none
    sequence: Any = None  # sequence-batched models: the `Sequence` it belongs to
    retried: bool = False  # sent again once after its worker died (never twice: it may be what kills them)

    @property
    def batch_size(self) -> int:
        return self.header.batch_size

    @property
    def shape_sig(self) -> str:
        return self.header.shape_sig


@dataclass(frozen=True)
class Slot:
    """One credit of one instance: the right to send it one batch."""

    worker: str
    instance: int
    credit: int
    subject: str
    generation: int = 0


@dataclass
class InFlight:
    key: tuple[str, int]
    slot: Slot
    requests: list[Pending]
    dispatched: float


def policy_for(spec: ModelSpec | None) -> BatchPolicy:
    if spec is None or spec.dynamic_batching is None:
        return BatchPolicy(spec.max_batch_size if spec else 0)
    db = spec.dynamic_batching
    return BatchPolicy(spec.max_batch_size, db.preferred_batch_sizes, db.max_queue_delay_us / 1e6, True)


@dataclass
class ModelQueue:
    key: tuple[str, int]
    spec: ModelSpec | None = None
    policy: BatchPolicy = field(default_factory=lambda: BatchPolicy(0))
    requests: RequestQueue = field(default_factory=RequestQueue)
    priorities: Priorities = field(default_factory=Priorities)
    needs: list[Need] = field(default_factory=list)  # per instance, for the rate limiter

    def need(self, instance: int) -> Need:
        return self.needs[instance] if 0 <= instance < len(self.needs) else Need()

    free: deque[Slot] = field(default_factory=deque)
    timer: asyncio.TimerHandle | None = None
    stats: ModelStats = field(default_factory=ModelStats)
    ordering: OrderedRelease = field(default_factory=OrderedRelease)  # used with preserve_ordering
    seq: SequenceQueue | None = None  # sequence-batched models: slots, backlog, idle timeouts

    @property
    def pending_count(self) -> int:
        return len(self.requests) + (self.seq.book.queued() if self.seq else 0)

    @property
    def preserve_ordering(self) -> bool:
        return bool(self.spec and self.spec.dynamic_batching and self.spec.dynamic_batching.preserve_ordering)


class SchedulerService:
    def __init__(self, settings: SchedulerSettings, nc: NATS) -> None:
        self.settings = settings
        self.nc = nc
        self.queues: dict[tuple[str, int], ModelQueue] = {}
        self.in_flight: dict[tuple[str, int], InFlight] = {}  # (worker, batch_id) -> batch
        self.liveness = WorkerLiveness(nc, settings.worker_timeout_s, self._drop_worker, self._worker_back)
        self._subs: dict[str, object] = {}  # model -> its infer subscription, while we hold its lease
        self._stats_sub = None
        self.limiter = RateLimiter(
            settings.rate_limit == "execution_count", parse_resources(settings.rate_limit_resource)
        )
        self.running: Counter[tuple[str, int]] = Counter()  # batches in flight per instance
        # every replica hears every completion: batch ids must not collide across replicas
        self._batch_ids = secrets.randbits(40)
        self._tasks: set[asyncio.Task] = set()
        self._loop = asyncio.get_running_loop()
        self.ensembles = EnsembleRunner(nc, settings.scheduler_id)  # ensembles run here, not on workers
        self.sequencer = Sequencer(self)
        self.handover = HandOver(self)  # live sequences across a voluntary hand-over
        # dispatchers ping this while we hold their requests (shared/holders.py): answered
        # only by this process, so a restart under the same id is not mistaken for it
        self.alive_subject = subjects.scheduler_alive(settings.scheduler_id, secrets.token_hex(4))

    async def start(self) -> None:
        await self.nc.subscribe(self.alive_subject, cb=self._on_alive)
        self.models_kv = await bus.bucket(self.nc, subjects.MODELS_BUCKET)
        self.leases = Leases(
            await bus.bucket(self.nc, subjects.LEASES_BUCKET, ttl=LEASE_TTL_S),
            self.settings.scheduler_id,
            self._gain,
            self._lose,
            self._model_idle,
            self.handover.begin,
        )
        await self.nc.subscribe(subjects.INSTANCE_FREE, cb=self._on_free)
        await self.liveness.start()
        await self.ensembles.start()
        await self.nc.subscribe(subjects.CREDITS_REVOKED, cb=self._on_revoked)
        await self.nc.subscribe(subjects.SCHEDULER_DRAIN, cb=self._on_drain)
        await self.nc.subscribe(subjects.SCHEDULER_CANCEL, cb=self._on_cancel)
        await self.nc.subscribe(subjects.SCHEDULER_CACHE, cb=self._on_cache)
        await self.handover.start()
        self._spawn(self.handover.run())
        self._spawn(self._watch_models())
        self._spawn(self.leases.run())
        self._spawn(self._expire())
        self.micro = await discovery.register(self.nc, "scheduler", self.settings.scheduler_id, self.status)
        await self.nc.publish(subjects.RESYNC, b"")  # workers re-announce their free instances
        log.info("scheduler %s started", self.settings.scheduler_id)

    async def _on_alive(self, msg) -> None:
        await msg.respond(b"")

    def status(self) -> dict:
        return {
            "queues": {
                f"{m}/{v}": {
                    "queued": q.pending_count,
                    "free_credits": len(q.free),
                    "running_batches": sum(1 for f in self.in_flight.values() if f.key == (m, v)),
                }
                for (m, v), q in self.queues.items()
            },
            "sequences": {f"{m}/{v}": q.seq.book.summary() for (m, v), q in self.queues.items() if q.seq},
            "workers": sorted(self.liveness.seen),
            "owned": sorted(self.leases.held),
            # sequences of models handed over that this replica still serves: "overlap" or "final"
            "handing_over": {
                f"{m}/{v}": "final" if final else "overlap" for (m, v), final in self.handover.held.items()
            },
        }

    async def stop(self) -> None:
        # another replica takes the models over at once; one with live sequences is served
        # here until they end (bounded), as in a hand-over to a joining replica
        keep = [m for m in self.leases.held if self.handover.worth_keeping(m)] if self.leases.replicas > 1 else []
        self.leases.closing = True
        for model in keep:
            await self.handover.begin(model)
        await self.leases.release_all()
        if keep:
            log.info("serving the live sequences of %s until they end (at most %g s)", keep, SHUTDOWN_RESIDUE_S)
            await asyncio.gather(*(self._hand_over(model, SHUTDOWN_RESIDUE_S) for model in keep))
        await self.handover.wait(SHUTDOWN_RESIDUE_S)  # hand-overs to a joining replica under way
        await self.micro.stop()
        self.liveness.stop()
        for task in list(self._tasks):
            task.cancel()

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def queue(self, model: str, version: int) -> ModelQueue:
        key = (model, version)
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = ModelQueue(key)
        return queue

    async def _watch_models(self) -> None:
        async for change in bus.watch(self.nc, self.models_kv):
            if not change.key:
                if self._stats_sub is None:  # answer statistics (a liveness probe too) once the
                    # models known at start are claimed
                    self._stats_sub = await self.nc.subscribe(subjects.SCHEDULER_STATS, cb=self._on_stats)
                continue
            name = subjects.untoken(change.key)
            record = _record_decoder.decode(change.value) if change.value is not None else None
            self.ensembles.on_record(name, record)
            hosted = set(record.hosted) if record is not None and record.active_config else set()
            for key in [k for k in self.queues if k[0] == name and k[1] not in hosted]:
                await self._abandon(self.queues[key], f"model '{name}' version {key[1]} was unloaded")
            if not hosted:
                await self.leases.drop(name)
                continue
            spec = spec_from_json(record.active_config)
            for version in hosted:
                queue = self.queue(name, version)
                queue.spec, queue.policy = spec, policy_for(spec)
                queue.priorities = Priorities.from_json(spec.config.get("dynamic_batching"))
                queue.needs = instance_needs(spec.config)
                self.limiter.learn(queue.needs)
                self.sequencer.configure(queue)
            await self.leases.want(name)

    # -- requests ---------------------------------------------------------------
    async def _on_request(self, msg) -> None:
        try:
            raws = _batch_decoder.decode(msg.data).requests
        except msgspec.DecodeError as exc:
            log.error("undecodable request on %s: %s", msg.subject, exc)
            return
        if msg.reply:  # tell the dispatcher who holds these, so it notices if we die
            await self.nc.publish(msg.reply, b"", headers={subjects.HELD_BY_HEADER: self.alive_subject})
        await self.take(raws)

    async def take(self, raws: list[msgspec.Raw], routed: bool = False) -> None:
        """Queue requests; those of sequences another replica holds go to it (`routed`: they
        were sent here by a replica, never send them on)."""
        try:
            headers = [_header_decoder.decode(raw) for raw in raws]
        except msgspec.DecodeError as exc:
            log.error("undecodable request: %s", exc)
            return
        now = time.monotonic()
        touched = {}
        forward: dict[str, list[msgspec.Raw]] = {}
        for raw, header in zip(raws, headers):
            queue = self.queue(header.model, header.version)
            if self.ensembles.handles(header.model):  # a dataflow over its steps, no queue of its own
                self.ensembles.submit(raw, queue.stats)
                continue
            holder = None if routed or queue.seq is None else self.handover.route(queue, header)
            if holder is not None:
                forward.setdefault(holder, []).append(raw)
            elif await self._admit(queue, header, raw, now):
                touched[queue.key] = queue
        for holder, held in forward.items():
            self.handover.forward(holder, held)
        for queue in touched.values():
            await self._pump(queue)

    async def _admit(self, queue: ModelQueue, header: RequestHeader, raw: msgspec.Raw, now: float) -> bool:
        """Queue a request at its priority level, or refuse it (queue full) at once."""
        level = queue.priorities.level(header.priority)
        policy = queue.priorities.policy(level)
        if policy.max_queue_size and queue.requests.size(level) >= policy.max_queue_size:
            await self._fail(queue, header, "Exceeds maximum queue size", "REJECTED")
            return False
        timeout_us = policy.timeout_us(header.timeout_us)
        now_ns = time.time_ns()
        pending = Pending(
            header,
            raw,
            now,
            time.monotonic_ns() if header.trace else 0,
            level,
            now_ns + timeout_us * 1000 if timeout_us else 0,
        )
        if queue.seq is not None:
            return await self.sequencer.admit(queue, pending)
        queue.requests.append(pending)
        if queue.preserve_ordering:
            queue.ordering.arrived(header.rid)
        if pending.queue_deadline_ns:  # be there when it times out, credits or not
            self._loop.call_later(timeout_us / 1e6, lambda q=queue: self._spawn(self._pump(q)))
        return True

    async def _pump(self, queue: ModelQueue) -> None:
        if queue.timer is not None:
            queue.timer.cancel()
            queue.timer = None
        if queue.seq is not None:
            await self.sequencer.pump(queue)
            return
        await self._drop_expired(queue)
        while queue.free and queue.requests:
            now = time.monotonic()
            decision = next_batch(queue.requests, queue.policy, now)
            if decision.take == 0:
                if decision.wake_at is not None:
                    queue.timer = self._loop.call_at(
                        self._loop.time() + (decision.wake_at - now),
                        lambda q=queue: asyncio.ensure_future(self._pump(q)),
                    )
                return
            slot = self._take_slot(queue)
            if slot is None:  # the rate limiter holds every free instance back: a release pumps again
                return
            batch = self._take_requests(queue, decision.take)  # both taken before any await
            if log.isEnabledFor(logging.DEBUG):  # --log-verbose, or the logging extension at run time
                request_ids.set(",".join(p.header.rid for p in batch))
                log.debug(
                    "batch of %d request(s), %d row(s) for '%s' version %d: %s; %d still queued",
                    len(batch),
                    sum(p.batch_size for p in batch),
                    queue.key[0],
                    queue.key[1],
                    decision.reason,
                    len(queue.requests),
                )
            await self._dispatch(queue, slot, batch, now, decision.reason)

    def _take_requests(self, queue: ModelQueue, count: int) -> list[Pending]:
        """Up to `count` requests, fewer if their bytes would not fit one bus message."""
        budget = self.nc.max_payload - 64 * 1024 if self.nc.max_payload else 1 << 20
        batch = [queue.requests.popleft()]
        size = len(batch[0].raw)
        while len(batch) < count and queue.requests and size + len(queue.requests[0].raw) <= budget:
            size += len(queue.requests[0].raw)
            batch.append(queue.requests.popleft())
        return batch

    async def _drop_expired(self, queue: ModelQueue) -> None:
        """Requests nobody waits for (past their deadline) leave; queue timeouts apply their policy."""
        if not queue.requests:
            return
        now_ns = time.time_ns()
        if all(p.header.deadline_ns > now_ns and not 0 < p.queue_deadline_ns <= now_ns for p in queue.requests):
            return  # the common case: nothing to do, and no queue rebuilt
        expired = queue.requests.remove(lambda p: p.header.deadline_ns <= now_ns)  # before any await
        timed_out = queue.requests.time_out(now_ns, queue.priorities)
        for pending in expired:
            queue.stats.record_request(False, now_ns - pending.header.received_ns, "REJECTED")
            await self._finish(queue, pending.header, None)
        for pending in timed_out:
            await self._fail(queue, pending.header, "Request timeout expired", "REJECTED")

    def _take_slot(self, queue: ModelQueue) -> Slot | None:
        """A credit of an instance the rate limiter lets run: preferably one with nothing running,
        then the fewest batches started for its priority, then the oldest credit."""
        candidates = [
            (
                self.running[(slot.worker, slot.instance)] > 0,
                self.limiter.weight(queue.need(slot.instance), (slot.worker, queue.key, slot.instance)),
                index,
            )
            for index, slot in enumerate(queue.free)
            if self.limiter.can_run(queue.need(slot.instance), slot.worker)
        ]
        if not candidates:
            return None
        index = min(candidates)[2]
        slot = queue.free[index]
        del queue.free[index]
        return slot

    async def _dispatch(
        self, queue: ModelQueue, slot: Slot, batch: list[Pending], now: float, reason: str, controls: list | None = None
    ) -> bool:
        self._batch_ids += 1
        queue_ns = [int((now - p.arrived) * 1e9) for p in batch]
        for ns in queue_ns:
            queue.stats.record_queue(ns)
        message = ExecBatch(
            batch_id=self._batch_ids,
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
        )
        try:
            await self.nc.publish(slot.subject, encode(message))
        except Exception as exc:  # not sent: the credit is still the worker's to use, the requests fail
            log.error("cannot send a batch of '%s' to worker %s: %s", queue.key[0], slot.worker, exc)
            queue.free.appendleft(slot)
            for pending in batch:
                await self._fail(queue, pending.header, f"cannot reach worker {slot.worker}: {type(exc).__name__}")
            return False
        self.in_flight[(slot.worker, self._batch_ids)] = InFlight(queue.key, slot, batch, now)
        self.running[(slot.worker, slot.instance)] += 1
        self.limiter.acquire(queue.need(slot.instance), slot.worker, (slot.worker, queue.key, slot.instance))
        return True

    # -- completions and credits -----------------------------------------------------
    async def _on_free(self, msg) -> None:
        free = bus.decode(_free_decoder, msg, log)
        if free is None:
            return
        self.liveness.heard(free.worker)
        queue = self.queue(free.model, free.version)
        if free.batch_id >= 0:
            await self._complete(queue, free)
        if free.instance >= 0:
            slot = Slot(free.worker, free.instance, free.credit, free.subject, free.generation)
            # a bare announcement for a credit now in flight is stale (sent before the batch
            # arrived): that batch's completion returns the credit
            stale = free.batch_id < 0 and any(f.slot == slot for f in self.in_flight.values())
            if not stale and slot not in queue.free:
                queue.free.append(slot)
        await self._pump(queue)
        await self._pump_held_back()

    def _finish_flight(self, key: tuple[str, int]) -> InFlight | None:
        flight = self.in_flight.pop(key, None)
        if flight is not None:
            self.running[(flight.slot.worker, flight.slot.instance)] -= 1
            queue = self.queue(*flight.key)
            self.limiter.release(queue.need(flight.slot.instance), flight.slot.worker)
            if queue.seq is not None:
                self.sequencer.finished(queue, flight)
        return flight

    async def _pump_held_back(self) -> None:
        """Resources were released: every queue the rate limiter held back may run now."""
        if self.limiter.enabled:
            for queue in list(self.queues.values()):
                if queue.free and (queue.requests or (queue.seq is not None and queue.seq.book.queued())):
                    await self._pump(queue)

    async def _complete(self, queue: ModelQueue, free: InstanceFree) -> None:
        mine = self.in_flight.get((free.worker, free.batch_id))
        if mine is None or mine.key != (free.model, free.version):
            return  # another replica's batch
        flight = self._finish_flight((free.worker, free.batch_id))
        if flight is None:
            return
        now_ns = time.time_ns()
        headers = {p.header.rid: p.header for p in flight.requests}
        ok_count = sum(1 for d in free.done if d.ok)
        if free.batch_size:
            busy = free.compute_input_ns + free.compute_infer_ns + free.compute_output_ns
            queue.stats.worker_compute_ns[free.worker] = queue.stats.worker_compute_ns.get(free.worker, 0) + busy
            queue.stats.worker_executions[free.worker] = queue.stats.worker_executions.get(free.worker, 0) + 1
            queue.stats.record_batch(
                free.batch_size, ok_count, free.compute_input_ns, free.compute_infer_ns, free.compute_output_ns
            )
        for done in free.done:
            header = headers.pop(done.rid, None)
            if header is None:
                continue
            queue.stats.record_request(done.ok, now_ns - header.received_ns)
            await self._finish(queue, header, done.response or None)
        for header in headers.values():  # the worker did not report them: fail, never lose
            await self._fail(queue, header, f"request was lost by worker {free.worker}")

    async def _fail(self, queue: ModelQueue, header: RequestHeader, message: str, reason: str = "OTHER") -> None:
        """Answer a request with a 503 and count it as failed for `reason` (Triton's metric label)."""
        queue.stats.record_request(False, time.time_ns() - header.received_ns, reason)
        response = encode(InferResponse(header.rid, error=message, code="UNAVAILABLE"))
        if queue.preserve_ordering:
            await self._finish(queue, header, response)
        else:
            await self.nc.publish(header.reply, response)

    async def _finish(self, queue: ModelQueue, header: RequestHeader, response: bytes | None) -> None:
        """Release a response now, or in arrival order for preserve_ordering models."""
        if not queue.preserve_ordering:
            if response is not None:
                await self.nc.publish(header.reply, response)
            return
        for reply, due in queue.ordering.finished(header.rid, header.reply, response):
            await self.nc.publish(reply, due)

    # -- worker liveness ------------------------------------------------------------
    async def _expire(self) -> None:
        """Bounds for what at-most-once messaging can lose: queued requests past their deadline
        leave even with no credit to wake the queue, and a batch whose completion never came is
        failed (its requests are past their deadline by then) and its credit returned."""
        while True:
            await asyncio.sleep(1.0)
            for queue in list(self.queues.values()):
                if queue.requests and not queue.free:
                    await self._drop_expired(queue)
                if queue.seq is not None:
                    await self.sequencer.expire(queue)
                    await self._pump(queue)
            cutoff = time.time_ns() - int(FLIGHT_GRACE_S * 1e9)
            for key, flight in list(self.in_flight.items()):
                if max(p.header.deadline_ns for p in flight.requests) < cutoff:
                    self._finish_flight(key)
                    queue = self.queue(*flight.key)
                    log.warning(
                        "batch %d of '%s' on worker %s never completed; failing it", key[1], flight.key[0], key[0]
                    )
                    for pending in flight.requests:
                        await self._fail(queue, pending.header, "the request was lost on its way to or from a worker")
                    if flight.slot not in queue.free:
                        queue.free.append(flight.slot)
                    await self._pump(queue)

    async def _worker_back(self, worker: str) -> None:
        await self.nc.publish(subjects.worker_resync(worker), b"")  # its idle credits were dropped

    async def _drop_worker(self, worker: str) -> None:
        log.warning("worker %s is gone; failing its in-flight requests", worker)
        for queue in self.queues.values():
            queue.free = deque(s for s in queue.free if s.worker != worker)
        for queue in list(self.queues.values()):
            if queue.seq is not None:  # before its flights end: freed slots must not go to backlogged sequences
                await self.sequencer.worker_lost(queue, worker)
        await self._recover_flights(worker)

    async def _recover_flights(self, worker: str) -> None:
        """The batches a lost worker held: the oldest per instance was running (it may be what
        killed the worker): its requests fail. The later ones were waiting at the worker behind
        it, never started: requests safe to run again (not in a sequence, not decoupled, before
        their deadline, not retried yet) go back to the front of their queue for another
        instance; the rest fail (docs/reliability.md, metric shoal_inference_request_retry)."""
        flights = sorted(((k, f) for k, f in self.in_flight.items() if k[0] == worker), key=lambda kf: kf[1].dispatched)
        running: set[int] = set()
        requeued: dict[tuple[str, int], ModelQueue] = {}
        now_ns = time.time_ns()
        for key, flight in flights:
            self._finish_flight(key)
            queue = self.queue(*flight.key)
            started = flight.slot.instance not in running  # the oldest batch of its instance
            running.add(flight.slot.instance)
            retry = not started and queue.seq is None and not (queue.spec and queue.spec.decoupled)
            for pending in reversed(flight.requests):  # appendleft: keep their order
                if retry and not pending.retried and pending.header.deadline_ns > now_ns:
                    pending.retried = True
                    queue.stats.retries += 1
                    queue.requests.appendleft(pending)
                    requeued[queue.key] = queue
                else:
                    await self._fail(
                        queue, pending.header, f"worker {worker} stopped responding while running the request"
                    )
        for queue in requeued.values():
            log.warning(
                "sending requests of '%s' that worker %s had not started to another instance", queue.key[0], worker
            )
            await self._pump(queue)

    # -- leases: which models this replica serves ----------------------------------------
    def _model_idle(self, model: str) -> bool:
        return all(self._idle(key) for key in self.queues if key[0] == model)

    async def _gain(self, model: str) -> None:
        # one queue group for every replica: while a model changes hands, both the old and
        # the new owner are subscribed and each request reaches exactly one of them. Claimed
        # back before the hand-over let it go (a quick unload/load): the subscription is still
        # ours; a second one would leak (benchmarks/load_cycles.py found it).
        if model not in self._subs:
            self._subs[model] = await self.nc.subscribe(
                subjects.infer(model), queue=subjects.SCHEDULER_QUEUE, cb=self._on_request
            )
        await self.handover.regain(model)
        await self.nc.publish(subjects.RESYNC, b"")  # workers announce their idle credits again

    async def _lose(self, model: str) -> None:
        """Stop taking requests for `model` once its new owner had time to subscribe, serve what
        is already queued, and only then give up what is left."""
        self._spawn(self._hand_over(model))

    async def _hand_over(self, model: str, keep_s: float = RESIDUE_MAX_S) -> None:
        await asyncio.sleep(HANDOVER_S)
        if self.leases.owns(model):  # claimed back meanwhile
            await self.handover.cancel(model)
            return
        sub = self._subs.pop(model, None)
        if sub is not None:
            await sub.unsubscribe()
        await self.handover.serve(model, keep_s)  # live sequences stay here until they end
        if self.leases.owns(model):  # it came back while we served them: ours again, nothing to give up
            return
        await self.handover.lost(model, f"scheduler {self.settings.scheduler_id} lost model '{model}'")
        deadline = time.monotonic() + HANDOVER_DRAIN_S
        while not self._model_idle(model) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for key in [k for k in self.queues if k[0] == model]:
            await self._abandon(
                self.queues[key], f"scheduler {self.settings.scheduler_id} no longer serves model '{model}'; retry"
            )

    async def _abandon(self, queue: ModelQueue, message: str) -> None:
        """The version is gone: fail what still waits for it (a drain normally left nothing)."""
        queue.free.clear()
        if queue.seq is not None:
            await self.sequencer.abandon(queue, message)
        while queue.requests:
            await self._fail(queue, queue.requests.popleft().header, message)

    async def _on_cache(self, msg) -> None:
        """Response-cache lookups done by gateways count in the model's statistics, as Triton's."""
        event = bus.decode(_cache_decoder, msg, log)
        if event is None:
            return
        if not self.leases.owns(event.model):
            return  # its owner counts it (gateways merge every replica's counts)
        stats = self.queue(event.model, event.version).stats
        if event.hit:
            stats.cache_hit.add(event.ns)
            stats.record_request(True, event.duration_ns)
            stats.queue.add(0)  # Triton's queue count includes cache hits
        else:
            stats.cache_miss.add(event.ns)

    async def _on_cancel(self, msg) -> None:
        """A client went away: its request leaves the queue (a running batch finishes; the
        gateway drops the late answer)."""
        cancel = bus.decode(_cancel_decoder, msg, log)
        if cancel is None or self.ensembles.cancel(cancel.rid):
            return
        queue = self.queues.get((cancel.model, cancel.version))
        if queue is None:
            return
        if queue.seq is not None:
            await self.sequencer.cancel(queue, cancel.rid)
            return
        for pending in queue.requests.remove(lambda p: p.header.rid == cancel.rid):
            queue.stats.record_request(False, time.time_ns() - pending.header.received_ns, "CANCELED")
            await self._finish(queue, pending.header, None)

    async def _on_revoked(self, msg) -> None:
        revoked = bus.decode(_revoked_decoder, msg, log)
        if revoked is None:
            return
        queue = self.queues.get((revoked.model, revoked.version))
        if queue is not None:
            queue.free = deque(
                s for s in queue.free if not (s.worker == revoked.worker and s.generation == revoked.generation)
            )
            if queue.seq is not None:  # the instances holding the sequences' state are gone
                await self.sequencer.worker_lost(
                    queue, revoked.worker, f"its instances on worker {revoked.worker} were reloaded or unloaded"
                )
            await self._pump(queue)

    # -- draining (unload) ------------------------------------------------------------
    def _idle(self, key: tuple[str, int]) -> bool:
        queue = self.queues.get(key)
        return (
            (queue is None or not queue.pending_count)
            and not any(f.key == key for f in self.in_flight.values())
            and not self.ensembles.busy(key)
        )

    async def _on_drain(self, msg) -> None:
        request = bus.decode(_drain_decoder, msg, log)
        if request is None or not self.leases.owns(request.model):
            return  # the model's owner answers
        self._spawn(self._drain(request, msg.reply))

    async def _drain(self, request: DrainRequest, reply: str) -> None:
        key = (request.model, request.version)
        deadline = time.monotonic() + request.timeout_s
        while not self._idle(key) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await self.nc.publish(reply, b"{}")

    # -- statistics ------------------------------------------------------------------
    async def _on_stats(self, msg) -> None:
        """Statistics per model version; a request may ask for latency quantiles (metrics summaries)."""
        quantiles: list[float] = []
        if msg.data:
            try:
                quantiles = [float(q) for q in msgspec.json.decode(msg.data).get("quantiles", [])]
            except (msgspec.DecodeError, AttributeError, TypeError, ValueError):
                quantiles = []
        stats = {
            f"{model}/{version}": {
                "stats": q.stats.json(model, str(version)),
                "fail_reasons": q.stats.fail_reasons,
                "pending": q.pending_count,
                "free_credits": len(q.free),
                "cache_enabled": bool(q.spec and q.spec.response_cache),
                "latency": q.stats.latencies.json(quantiles),
                "worker_compute_ns": q.stats.worker_compute_ns,
                "worker_executions": q.stats.worker_executions,
                "retries": q.stats.retries,
            }
            for (model, version), q in self.queues.items()
            if self.leases.owns(model) or q.stats.success.count or q.stats.fail.count or q.stats.cache_miss.count
        }
        self.ensembles.annotate(stats)
        await msg.respond(msgspec.json.encode(stats))


async def run(settings: SchedulerSettings, stop: asyncio.Event) -> None:
    nc = await bus.connect(settings.nats_url, f"shoal-scheduler-{settings.scheduler_id}")
    await serve_until(stop, nc, SchedulerService(settings, nc), "scheduler")
