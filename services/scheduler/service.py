"""The scheduler process: NATS subscriptions, decoding, and the wiring of its parts.

Requests arrive from gateways on `shoal.infer.<model>`. Only their header is decoded; the
original bytes are forwarded in the batch. What happens to them lives in the sub-packages:
`batching/` (queues, batch formation, dispatch on worker credits), `sequences/` (the
sequence batcher), `ensembles/` (ensembles run here as a dataflow over their steps),
`replicas/` (which replica serves which model, hand-overs), `statistics/`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.scheduler.acknowledgements import Acknowledgements
from services.scheduler.batching.answers import Answers
from services.scheduler.batching.credits import Credits
from services.scheduler.batching.flights import Flights
from services.scheduler.batching.model_queue import ModelQueue
from services.scheduler.batching.pump import Pump
from services.scheduler.batching.ratelimit import RateLimiter, parse_resources
from services.scheduler.batching.worker_channels import WorkerChannels
from services.scheduler.discipline_factory import DisciplineFactory
from services.scheduler.ensembles.ensemble_runner import EnsembleRunner
from services.scheduler.holdings import Holdings
from services.scheduler.replicas.ownership import Ownership
from services.scheduler.scheduling_records import Key
from services.scheduler.sequences.sequence_batcher import sequence_batcher_of
from services.scheduler.statistics.report import Signals, quantiles_asked, report
from services.scheduler.tasks import Tasks
from services.scheduler.usage import model_usage
from shared.bus import buckets, connection, discovery, hot_path
from shared.bus.liveness import WorkerLiveness
from shared.config.model_config import spec_from_json
from shared.process.runtime import serve_until
from shared.process.settings import SchedulerSettings
from shared.tracing import spans
from shared.wire import subjects
from shared.wire.control import DrainDone, DrainRequest, UsageReply
from shared.wire.messages import (
    CacheEvent,
    CancelRequest,
    CreditsRevoked,
    FirstResponse,
    InstanceFree,
    RequestBatch,
    RequestHeader,
    encode,
)
from shared.wire.records import ModelRecord, shown_name
from shared.wire.status import QueueStatus, SchedulerStatus

log = logging.getLogger("shoal.scheduler")

_header_decoder = msgspec.msgpack.Decoder(RequestHeader)
_batch_decoder = msgspec.msgpack.Decoder(RequestBatch)
_revoked_decoder = msgspec.msgpack.Decoder(CreditsRevoked)
_drain_decoder = msgspec.msgpack.Decoder(DrainRequest)
_cancel_decoder = msgspec.msgpack.Decoder(CancelRequest)
_cache_decoder = msgspec.msgpack.Decoder(CacheEvent)
_free_decoder = msgspec.msgpack.Decoder(InstanceFree)
_first_decoder = msgspec.msgpack.Decoder(FirstResponse)
_record_decoder = msgspec.msgpack.Decoder(ModelRecord)


class SchedulerService:
    """The scheduler's parts on one NATS connection. `local_inbox`: co-hosted in the gateway with
    that inbox, whose requests come by function call (`cohosted.CoHosted`), not over the bus."""

    def __init__(
        self, settings: SchedulerSettings, nc: NATS, local_inbox: str = "", channels: WorkerChannels | None = None
    ) -> None:
        self.settings = settings
        self.nc = nc
        self.tasks = Tasks()
        limiter = RateLimiter(settings.rate_limit == "execution_count", parse_resources(settings.rate_limit_resource))
        self.flights, answers = Flights(), Answers(nc.publish)
        self.pump = Pump(
            nc,
            limiter,
            self.tasks,
            self.flights,
            answers,
            DisciplineFactory(nc.publish),
            local_inbox,
            channels,
            settings.prefix_routing,
        )
        self.credits = Credits(self.pump, self.flights, answers)
        self.holdings = Holdings(nc, self.flights, self.credits, self.tasks)  # batches lost with a connection
        self.liveness = WorkerLiveness(
            nc, settings.worker_timeout_s, self.credits.worker_lost, self._worker_back, probe=True
        )
        # ensembles run here, not on workers; their steps reach this replica's own models by a call
        self.ensembles = EnsembleRunner(nc, settings.scheduler_id, local=self)
        # dispatchers ping this while we hold their requests (shared/bus/holders.py), and other
        # replicas before taking our leases (replicas/takeover.py): answered only by this process,
        # so a restarted scheduler with the same id is not mistaken for it
        self.alive_subject = subjects.scheduler_alive(settings.scheduler_id, secrets.token_hex(4))
        self.ownership = Ownership(nc, settings.scheduler_id, self, self.pump, self.take, self.alive_subject)
        self._subs: dict[str, Subscription] = {}  # model -> its infer subscription, while we hold its lease
        self._stats_sub: Subscription | None = None
        self.acknowledgements = Acknowledgements(nc.publish, self.alive_subject)

    async def start(self) -> None:
        await self.nc.subscribe(self.alive_subject, cb=self._on_alive)
        self.models_kv = await buckets.bucket(self.nc, subjects.MODELS_BUCKET, create=False)
        await hot_path.subscribe(self.nc, subjects.INSTANCE_FREE, self._on_free)
        await self.nc.subscribe(subjects.FIRST_RESPONSE, cb=self._on_first_response)
        await self.liveness.start()
        await self.ensembles.start(self.models_kv)
        await self.nc.subscribe(subjects.CREDITS_REVOKED, cb=self._on_revoked)
        await self.nc.subscribe(subjects.SCHEDULER_DRAIN, cb=self._on_drain)
        await self.nc.subscribe(subjects.SCHEDULER_CANCEL, cb=self._on_cancel)
        await self.nc.subscribe(subjects.SCHEDULER_CACHE, cb=self._on_cache)
        await self.nc.subscribe(subjects.SCHEDULER_USAGE, cb=self._on_usage)
        await self.holdings.start()
        # batches sent just before our own connection dropped may be lost (workers say what they
        # hold), and so may request groups on their way to us (dispatchers send them again)
        connection.on_connection(self.nc, lambda: None, lambda: self.tasks.spawn(self._reconnected()))
        await self.ownership.start()
        self.tasks.spawn(self._watch_models())
        self.tasks.spawn(self.credits.expire_forever())
        self.micro = await discovery.register(self.nc, "scheduler", self.settings.scheduler_id, self.status)
        await self.nc.publish(subjects.RESYNC, b"")  # workers re-announce their free instances
        log.info("scheduler %s started", self.settings.scheduler_id)

    def _signals(self, queue: ModelQueue) -> Signals:
        """The queue's autoscaling signals (docs/scaling.md)."""
        busy, known = self.pump.instances_in_use(queue)
        return Signals(int(self.pump.oldest_wait_s(queue) * 1e6), self.flights.count(queue.key), busy, known)

    def _queue_status(self, queue: ModelQueue) -> QueueStatus:
        signals, stats = self._signals(queue), queue.stats
        return QueueStatus(
            self.pump.pending(queue),
            len(queue.free),
            signals.running_batches,
            oldest_wait_s=signals.oldest_wait_us / 1e6,
            busy_instances=signals.busy_instances,
            instances=signals.instances,
            requests=stats.success.count + stats.fail.count,
        )

    def status(self) -> SchedulerStatus:
        queues = self.pump.queues
        return SchedulerStatus(
            queues={f"{m}/{v}": self._queue_status(q) for (m, v), q in queues.items()},
            sequences={
                f"{m}/{v}": batcher.book.summary()
                for (m, v), q in queues.items()
                for batcher in (sequence_batcher_of(q),)
                if batcher is not None
            },
            workers=sorted(self.liveness.seen),
            # the workers NATS would show gone at once (shared/bus/liveness.py); the others by heartbeat only
            probed_workers=sorted(self.liveness.answering),
            owned=self.ownership.owned(),
            handing_over=self.ownership.handing_over(),
        )

    async def stop(self) -> None:
        await self.ownership.stop()
        await self.micro.stop()
        self.liveness.stop()
        if self.pump.channels is not None:
            self.pump.channels.close()
        await self.acknowledgements.stop()
        self.tasks.cancel_all()

    def worker_suspect(self, worker: str) -> None:
        """`worker`'s local channel closed: NATS is asked about it now (shared/bus/liveness.py); if
        it lives, the workers say which batches they hold, and a batch written as the channel
        closed and never read ends as one lost with a connection (holdings.py)."""
        self.tasks.spawn(self._suspect(worker))

    async def _suspect(self, worker: str) -> None:
        if not await self.liveness.check(worker):
            await self.holdings.ask()

    async def _watch_models(self) -> None:
        async for change in buckets.watch(self.nc, self.models_kv):
            if not change.key:
                if self._stats_sub is None:  # answer statistics (a liveness probe too) once the
                    # models known at start are claimed
                    self._stats_sub = await self.nc.subscribe(subjects.SCHEDULER_STATS, cb=self._on_stats)
                continue
            name = subjects.untoken(change.key)
            record = _record_decoder.decode(change.value) if change.value is not None else None
            await self._on_record(name, record, change.revision)

    async def _on_record(self, name: str, record: ModelRecord | None, revision: int) -> None:
        """A model's record changed: its versions' queues follow its config, or are abandoned."""
        self.ensembles.on_record(name, record, revision)
        hosted = set(record.hosted) if record is not None and record.active_config else set()
        for queue in [q for q in self.pump.of_model(name) if q.key[1] not in hosted]:
            await self.pump.abandon(queue, f"model '{shown_name(name)}' version {queue.key[1]} was unloaded")
        if record is None or not hosted:
            await self.ownership.drop(name)
            return
        spec = spec_from_json(record.active_config, name)
        for version in hosted:
            self.pump.configure(self.pump.queue(name, version), spec)
        await self.ownership.want(name)

    # -- requests ---------------------------------------------------------------------
    async def _on_request(self, msg: Msg) -> None:
        batch: RequestBatch | None = connection.decode(_batch_decoder, msg, log)
        if batch is not None:
            if msg.reply:  # tell the dispatcher who holds these, so that it notices if we die
                await self.acknowledgements.took(msg.reply)
            await self.take(batch.requests)

    async def _reconnected(self) -> None:
        # beside the rest (a leaderless leases stream makes renewals wait): models taken meanwhile
        self.tasks.spawn(self.ownership.reconnected())
        await self.holdings.ask()
        # first what we took and owe acknowledgements for: those are held, not lost
        await self.acknowledgements.flush()
        await self.nc.publish(
            subjects.SCHEDULER_RECONNECTED, b"", headers={subjects.HELD_BY_HEADER: self.alive_subject}
        )
        await self.holdings.ask_again_after_reconnect()

    async def _on_alive(self, msg: Msg) -> None:
        await msg.respond(b"")

    async def take(self, raws: list[msgspec.Raw], routed: bool = False) -> None:
        """Queue requests; those of sequences another replica holds go to it (`routed`: they
        were sent here by a replica, never send them on)."""
        try:
            headers = [_header_decoder.decode(raw) for raw in raws]
        except msgspec.DecodeError as exc:
            log.error("undecodable request: %s", exc)
            return
        now = time.monotonic()
        touched: dict[Key, ModelQueue] = {}
        forward: dict[str, list[msgspec.Raw]] = {}
        handover = self.ownership.handover
        for raw, header in zip(raws, headers):
            queue = self.pump.queue(header.model, header.version)
            if self.ensembles.handles(header.model):  # a dataflow over its steps, no queue of its own
                self.ensembles.submit(raw, queue.stats)
                continue
            # only while other replicas hold sequences of its model (`seen`) may a request go elsewhere
            holder = None if routed or not handover.seen else handover.route(queue, header)
            if holder is not None:
                forward.setdefault(holder, []).append(raw)
            elif await self.pump.admit(queue, header, raw, now):
                touched[queue.key] = queue
        for holder, held in forward.items():
            handover.forward(holder, held)
        for queue in touched.values():
            await self.pump.pump(queue)

    async def _on_cancel(self, msg: Msg) -> None:
        """A client went away: its request leaves the queue (a running batch finishes; the
        gateway drops the late answer)."""
        cancel: CancelRequest | None = connection.decode(_cancel_decoder, msg, log)
        if cancel is None or self.ensembles.cancel(cancel.rid):
            return
        queue = self.pump.find((cancel.model, cancel.version))
        if queue is not None:
            await self.pump.cancel(queue, cancel.rid)

    # -- credits ----------------------------------------------------------------------
    async def _on_free(self, msg: Msg) -> None:
        free: InstanceFree | None = connection.decode(_free_decoder, msg, log)
        if free is not None:
            self.liveness.heard(free.worker)
            await self.credits.on_free(free)

    async def _on_first_response(self, msg: Msg) -> None:
        first: FirstResponse | None = connection.decode(_first_decoder, msg, log)
        if first is not None:
            self.credits.late_first.arrived(first.rid, first.sent_ns)

    def owns(self, model: str) -> bool:
        """Whether this replica holds the model's lease (`shared.bus.dispatch.LocalScheduler`)."""
        return self.ownership.owns(model)

    async def completed(self, free: InstanceFree) -> None:
        """A batch this co-hosted replica sent completed (from `BatchDone`). A model it no longer
        serves: the completion goes to every scheduler as the worker would have sent it, so the
        credit reaches the model's new owner (and this replica ends its flight from there)."""
        if not self.ownership.owns(free.model):
            await self.nc.publish(subjects.INSTANCE_FREE, msgspec.msgpack.encode(free))
            return
        self.liveness.heard(free.worker)
        await self.credits.on_free(free)

    async def _on_revoked(self, msg: Msg) -> None:
        revoked: CreditsRevoked | None = connection.decode(_revoked_decoder, msg, log)
        if revoked is not None:
            await self.credits.revoked(revoked)

    async def _worker_back(self, worker: str) -> None:
        await self.nc.publish(subjects.worker_resync(worker), b"")  # its idle credits were dropped

    # -- for the model's ownership (`replicas.ownership.Served`) ------------------------
    async def subscribe(self, model: str) -> None:
        # one queue group for every replica: while a model changes hands, both the old and
        # the new owner are subscribed and each request reaches exactly one of them. Claimed
        # back before the hand-over let it go (a quick unload/load): the subscription is still
        # ours; a second one would leak (benchmarks/load_cycles.py found it).
        if model not in self._subs:
            self._subs[model] = await hot_path.subscribe(
                self.nc, subjects.infer(model), self._on_request, queue=subjects.SCHEDULER_QUEUE
            )

    async def unsubscribe(self, model: str) -> None:
        sub = self._subs.pop(model, None)
        if sub is not None:
            await sub.unsubscribe()

    def idle(self, model: str) -> bool:
        return all(self._idle(q.key) for q in self.pump.of_model(model))

    async def abandon(self, model: str, message: str) -> None:
        for queue in self.pump.of_model(model):
            await self.pump.abandon(queue, message)

    def _idle(self, key: Key) -> bool:
        return self.pump.idle(key) and not self.ensembles.busy(key)

    # -- drains (unload), statistics ----------------------------------------------------
    async def _on_drain(self, msg: Msg) -> None:
        request: DrainRequest | None = connection.decode(_drain_decoder, msg, log)
        if request is None:
            return
        # the replica the repository found holding the lease answers, even if the model moved
        # since (it may still finish what it queued); no holder named: the model's owner does
        asked = request.holder == self.settings.scheduler_id if request.holder else self.ownership.owns(request.model)
        if asked:
            self.tasks.spawn(self._drain(request, msg.reply))

    async def _drain(self, request: DrainRequest, reply: str) -> None:
        """Answer once the version has nothing queued or running, or at the drain's timeout
        (then the repository asks again, services/repository/drain.py)."""
        key = (request.model, request.version)
        deadline = time.monotonic() + request.timeout_s
        while not self._idle(key) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await self.nc.publish(reply, encode(DrainDone(self._idle(key))))

    async def _on_cache(self, msg: Msg) -> None:
        """Response-cache lookups done by gateways count in the model's statistics, as Triton's."""
        event: CacheEvent | None = connection.decode(_cache_decoder, msg, log)
        if event is not None and self.ownership.owns(event.model):  # else its owner counts it
            self.pump.queue(event.model, event.version).stats.record_cache_lookup(
                event.hit, event.ns, event.duration_ns
            )

    async def _on_usage(self, msg: Msg) -> None:
        """On-demand eviction asks which models are in use and when each was last used."""
        usage = model_usage(self.pump.queues.values(), self.ownership.owns, self.idle)
        await msg.respond(msgspec.json.encode(UsageReply(usage, self.ownership.replicas())))

    async def _on_stats(self, msg: Msg) -> None:
        """Statistics per model version; a request may ask for latency quantiles (metrics summaries)."""
        stats = report(
            self.pump.queues.values(), self.ownership.owns, quantiles_asked(msg.data), self.pump.pending, self._signals
        )
        stats.replicas = await self.ownership.replicas_now()
        self.ensembles.annotate(stats)
        await msg.respond(encode(stats))


async def run(settings: SchedulerSettings, stop: asyncio.Event) -> None:
    spans.install(spans.from_config(settings.trace_config), "scheduler", settings.scheduler_id)
    nc = await connection.connect(
        settings.nats_url, f"shoal-scheduler-{settings.scheduler_id}", settings.nats_credentials
    )
    try:
        await serve_until(stop, nc, SchedulerService(settings, nc), "scheduler", settings.health_port)
    finally:
        spans.uninstall()
