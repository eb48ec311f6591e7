"""The worker: runs the batches the scheduler sends on the instances it hosts.

Each instance runs on its own thread (native backends release the GIL). After a
batch the worker replies straight to each request's gateway (one message per gateway),
then tells the scheduler the instance is free (with the batch's timings), which is
also the credit for the next batch. Running a batch is `batches.BatchExecutor`'s job,
which models it hosts `model_lifecycle.ModelLifecycle`'s; this module wires them to the bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
import uuid

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from services.worker.background_tasks import BackgroundTasks
from services.worker.batches.batch_executor import BatchExecutor
from services.worker.batches.completions import Completions
from services.worker.batches.decoupled_streams import Cancellations, DecoupledSenders
from services.worker.batches.hot_loop import HotLoop
from services.worker.batches.instances import Instance, LoadedModel
from services.worker.batches.response_outputs import Outputs
from services.worker.channel_listener import ChannelListener
from services.worker.heartbeat import HeartbeatThread, LoopHeartbeat
from services.worker.model_lifecycle import ModelLifecycle
from services.worker.python.hosting.bls import BlsRuntime
from services.worker.python.hosting.callables import InProcessModels
from services.worker.python.triton_api import pb_utils
from shared.bus import connection, discovery, hot_path, local_channel
from shared.bus.local_channel import FrameSink
from shared.bus.tensor_store import TensorStore
from shared.memory import footprint
from shared.process import lifeline
from shared.process.runtime import serve_until
from shared.process.settings import WorkerSettings
from shared.tracing import spans
from shared.wire import subjects
from shared.wire.control import WorkerMetrics
from shared.wire.messages import (
    CancelRequest,
    CreditsRevoked,
    ExecBatch,
    InstanceFree,
    ReadinessAnswer,
    ReadinessCheck,
    SequenceEnded,
    WorkerExited,
    WorkerHeartbeat,
    WorkerHoldings,
    encode,
)
from shared.wire.records import shown_name
from shared.wire.status import HostedStatus, InstanceStatus, WorkerStatus

log = logging.getLogger("shoal.worker")

_batch_decoder = msgspec.msgpack.Decoder(ExecBatch)
_cancel_decoder = msgspec.msgpack.Decoder(CancelRequest)
_readiness_decoder = msgspec.msgpack.Decoder(ReadinessCheck)
_ended_decoder = msgspec.msgpack.Decoder(SequenceEnded)
LATE_S = 2.0  # a tick this late is worth a line in the log: the loop was busy (e.g. loading models)
# a drain ends once no batch was held for this long after the credits were revoked: a batch a
# scheduler sent before it heard of the revocation arrives within it (`drain`)
DRAIN_QUIET_S = 1.0
DRAIN_POLL_S = 0.05


class WorkerService:
    def __init__(self, settings: WorkerSettings, nc: NATS, local: InProcessModels | None = None) -> None:
        self.settings = settings
        self.nc = nc
        # one id per process incarnation: a restarted worker must not inherit the
        # batches its predecessor never finished
        self.id = f"{settings.worker_id}-{uuid.uuid4().hex[:6]}"
        self.subject = subjects.worker_exec(self.id)
        self.store = TensorStore(nc, self.id, settings.inline_max_bytes, settings.tensor_transport)
        self.lifecycle = ModelLifecycle(
            self.id, settings, nc, on_ready=self._grant_idle, on_retired=self._revoke, local=local
        )
        self._tasks = BackgroundTasks()
        self._loop = asyncio.get_running_loop()
        self.cancellations = Cancellations()
        outputs = Outputs(self.store)
        self.decoupled = DecoupledSenders(nc, outputs.streamed, self.cancellations)
        self.completions = Completions(nc, self.id)
        self.batches = BatchExecutor(
            self.id,
            nc,
            self.store,
            outputs,
            self.cancellations,
            self.decoupled,
            self.completions,
        )
        # a python model's instance process runs what comes by its local channel on the channel's
        # own thread when it can, as Triton's stub does (docs/design.md §9, "The hot loop")
        self.hot = HotLoop(self.lifecycle.models, self.batches) if settings.instance_index >= 0 else None
        # batches from the gateways of this host without nats-server (docs/design.md §9)
        self.channels = (
            ChannelListener(
                self.id,
                self.store.host,
                self._batch_arrived,
                settings.runtime_dir,
                here=self.hot.take if self.hot is not None else None,
            )
            if settings.local_channel and settings.tensor_transport != "bus" and local_channel.supported()
            else None
        )
        self.bls = BlsRuntime(nc, self.store, self.id)
        self._arrived = [0, 0]  # batches over NATS, over the local channel (`status`)
        self._draining = False
        self.budget_bytes = footprint.parse_budget(settings.model_memory_budget)
        self.beats: HeartbeatThread | LoopHeartbeat = (
            LoopHeartbeat(nc, self._loading)  # a python model's process: one model, watched by its worker
            if settings.parent_pid
            else HeartbeatThread(
                settings.nats_url,
                f"shoal-worker-{settings.worker_id}-heartbeat",
                settings.heartbeat_s,
                self._loading,
                credentials=settings.nats_credentials,
            )
        )

    def _loading(self) -> int:
        return self.lifecycle.loader.loading

    async def start(self) -> None:
        await self.store.start()
        await self.bls.start()
        await self.completions.start()
        if self.channels is not None and await self.channels.start():
            self.batches.local = self.channels.advertisement  # named in every credit from now on
        self._tasks.spawn(self.decoupled.run())
        await self.nc.subscribe(subjects.SCHEDULER_CANCEL, cb=self._on_cancel)
        await hot_path.subscribe_now(self.nc, self.subject, self._on_batch)
        await self.nc.subscribe(subjects.RESYNC, cb=self._on_resync)
        await self.nc.subscribe(subjects.worker_resync(self.id), cb=self._on_resync)
        await self.nc.subscribe(subjects.worker_report(self.id), cb=self._on_report_request)
        await self.nc.subscribe(subjects.worker_readiness(self.id), cb=self._on_readiness)
        # schedulers ask here whether this worker's connection lives (shared/bus/liveness.py): subscribed
        # before the first heartbeat names this worker
        await self.nc.subscribe(subjects.worker_alive(self.id), cb=self._on_alive)
        await self.nc.subscribe(subjects.HOLDINGS_ASK, cb=self._on_holdings_asked)
        # batches sent to us while our connection was down are lost: schedulers learn which we hold
        connection.on_connection(self.nc, lambda: None, lambda: self._tasks.spawn(self._reconnected()))
        await self.nc.subscribe(subjects.worker_sequence(self.id), cb=self._on_sequence_ended)
        await self.lifecycle.start()
        self.lifecycle.loader.on_idle = self.beats.beat_now  # "no longer loading" must not wait a beat
        self.beats.start()
        self._tasks.spawn(self._tick())
        self.micro = await discovery.register(self.nc, "worker", self.id, self.status, shm_host=self.store.host)
        # the objects made by imports and start-up live as long as the process: out of the
        # collector's sight, the full collection each unload runs (model_lifecycle.py) costs ~0 ms instead
        # of ~125 ms, which was most of an on-demand eviction (benchmarks/on_demand.py)
        gc.collect()
        gc.freeze()
        log.info("worker %s started", self.id)

    async def _on_alive(self, msg: Msg) -> None:
        await msg.respond(b"")

    async def _on_holdings_asked(self, msg: Msg) -> None:
        await self._say_holdings(msg.reply)  # to the scheduler that asked (services/scheduler/holdings.py)

    async def _reconnected(self) -> None:
        """What we hold, now and again once the cluster's interest has settled (a batch sent to us
        before a scheduler heard of our new connection was dropped, and only a later answer shows it)."""
        await self._say_holdings()
        waited = 0.0
        for delay in connection.RECONNECT_SETTLE_S:
            await asyncio.sleep(delay - waited)
            waited = delay
            await self._say_holdings()

    async def _say_holdings(self, to: str = "") -> None:
        holdings = encode(WorkerHoldings(self.id, sorted(self.batches.holding)))
        await self.nc.publish(to or subjects.WORKER_HOLDINGS, holdings)

    def status(self) -> WorkerStatus:
        return WorkerStatus(
            budget_bytes=self.budget_bytes,
            max_models=self.settings.max_loaded_models,
            models={
                f"{m}/{v}": HostedStatus(
                    generation=loaded.generation,
                    instances=len(loaded.instances),
                    busy_instances=sum(1 for i in loaded.instances if i.busy),
                    rss_bytes=loaded.rss_bytes,
                    device_bytes=loaded.device_bytes,
                    instance_list=[InstanceStatus(i.name, i.kind, i.device, i.executions) for i in loaded.instances],
                )
                for (m, v), loaded in self.lifecycle.models.items()
            },
            batches_over_nats=self._arrived[0],
            batches_over_channel=self._arrived[1] + (self.hot.ran if self.hot is not None else 0),
            batches_hot_loop=self.hot.ran if self.hot is not None else 0,
            local_channel=self.channels.path if self.channels is not None else "",
        )

    async def drain(self) -> None:
        """Before a stop (SIGTERM: a scale-down, a rolling update): take no new batch, finish those held.

        Every hosted version's credits are revoked (the schedulers send nothing more here, and put
        nothing back on a credit of ours), completions from now on return none, and the worker
        stays until it held no batch for `DRAIN_QUIET_S` (a batch sent before a scheduler heard of
        the revocation arrives within it), or `drain_timeout_s` passed. What it still holds then is
        the schedulers' to recover, as for a worker that died (docs/reliability.md)."""
        timeout = self.settings.drain_timeout_s
        if timeout <= 0 or self._draining or not self.lifecycle.models:
            return
        self._draining = True
        self.beats.update(self._heartbeat())  # not placeable: no model is loaded here on demand now
        for loaded in list(self.lifecycle.models.values()):
            loaded.draining = True
            await self._revoke(loaded)
        with contextlib.suppress(Exception):
            await self.nc.flush(timeout=2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        quiet_since = started
        while loop.time() - started < timeout:
            if self.batches.holding:
                quiet_since = loop.time()
            elif loop.time() - quiet_since >= DRAIN_QUIET_S:
                log.info("worker %s drained in %.1f s", self.id, loop.time() - started)
                return
            await asyncio.sleep(DRAIN_POLL_S)
        log.warning(
            "worker %s still held %d batch(es) after %.0f s of draining", self.id, len(self.batches.holding), timeout
        )

    async def stop(self) -> None:
        await self.drain()
        self.beats.stop()
        await self.micro.stop()
        self._tasks.cancel_all()
        await self.lifecycle.stop()
        if self.channels is not None:
            await self.channels.stop()
        await self.bls.stop()
        await self.store.close()
        if not self.settings.parent_pid:  # (a python model's process: its worker says so)
            # gone now, not a heartbeat timeout later: the repository places no on-demand load here
            # meanwhile (a scale to zero), the schedulers drop its credits at once
            with contextlib.suppress(Exception):
                await self.nc.publish(subjects.WORKER_EXITED, encode(WorkerExited(self.settings.worker_id, 0)))

    # -- credits ----------------------------------------------------------------
    async def _grant_idle(self, loaded: LoadedModel) -> None:
        """Announce every idle credit; first credits of all instances first, so batches spread."""
        if loaded.retired or self._draining:
            return
        for credit in range(max(i.credits for i in loaded.instances)):
            for instance in loaded.instances:
                if credit in instance.idle:
                    free = InstanceFree(
                        self.id,
                        loaded.spec.name,
                        loaded.version,
                        instance.index,
                        self.subject,
                        credit=credit,
                        local=self.batches.local,
                        generation=loaded.generation,
                    )
                    await self.nc.publish(subjects.INSTANCE_FREE, encode(free))

    async def _revoke(self, loaded: LoadedModel) -> None:
        revoked = CreditsRevoked(self.id, loaded.spec.name, loaded.version, loaded.generation)
        await self.nc.publish(subjects.CREDITS_REVOKED, encode(revoked))

    async def _on_report_request(self, msg: Msg) -> None:
        await self.lifecycle.report_all()

    async def _on_sequence_ended(self, msg: Msg) -> None:
        """A sequence ended without END (idle timeout, cancelled END): free its implicit state and
        tell a python model that defines the (Shoal-only, optional) `sequence_ended(correlation_id,
        reason)` method, on the instance's own thread so it never overlaps an `execute`."""
        ended = connection.decode(_ended_decoder, msg, log)
        if ended is None:
            return
        loaded = self.lifecycle.models.get((ended.model, ended.version))
        if loaded is None:
            return
        if loaded.states is not None:
            loaded.states.drop(ended.corrid, ended.seq)
        if 0 <= ended.instance < len(loaded.instances):
            instance = loaded.instances[ended.instance]
            if not instance.closed:
                try:
                    await self._loop.run_in_executor(
                        instance.executor, instance.runner.sequence_ended, ended.corrid, ended.reason
                    )
                except Exception:
                    log.exception("sequence_ended of '%s' failed", ended.model)

    async def _on_readiness(self, msg: Msg) -> None:
        """A gateway's model readiness request: the instances' own is_ready() answers (each may
        take up to 5 s, so each request runs apart; the subscription takes the next at once)."""
        check = connection.decode(_readiness_decoder, msg, log)
        if check is not None and msg.reply:
            self._tasks.spawn(self._answer_readiness(check, msg.reply))

    async def _answer_readiness(self, check: ReadinessCheck, reply: str) -> None:
        ready, message = await self.lifecycle.readiness(check.model, check.version)
        await self.nc.publish(reply, encode(ReadinessAnswer(ready, message)))

    async def _on_resync(self, msg: Msg) -> None:
        for loaded in list(self.lifecycle.models.values()):
            await self._grant_idle(loaded)

    def _heartbeat(self) -> WorkerHeartbeat:
        instances = {f"{m}/{v}": len(loaded.instances) for (m, v), loaded in self.lifecycle.models.items()}
        return WorkerHeartbeat(
            self.id,
            self.subject,
            self.store.host,
            instances,
            self.settings.heartbeat_s,
            budget_bytes=self.budget_bytes,
            max_models=self.settings.max_loaded_models,
            models=self.settings.models,
            # a draining worker takes no model on demand
            placeable=self.lifecycle.local is None and not self.settings.parent_pid and not self._draining,
            supervised=bool(self.settings.parent_pid),
        )

    async def _tick(self) -> None:
        """The main loop's periodic work; the beat itself goes out from `HeartbeatThread`."""
        interval = self.settings.heartbeat_s
        last = time.monotonic()
        while True:
            self.beats.update(self._heartbeat())
            now = time.monotonic()
            if now - last > interval + LATE_S:
                log.info(
                    "the event loop was busy for %.1f s (%d model load(s) in progress)",
                    now - last,
                    self.lifecycle.loader.loading,
                )
            last = now
            families = pb_utils.metrics_snapshot()
            if families:  # python models' custom metrics: every gateway keeps the last of each worker
                await self.nc.publish(subjects.WORKER_METRICS, encode(WorkerMetrics(self.id, families)))
            self.decoupled.expire()
            await asyncio.sleep(interval)

    async def _on_cancel(self, msg: Msg) -> None:
        """A client went away: a python model running its request sees `is_cancelled()`."""
        cancel = connection.decode(_cancel_decoder, msg, log)
        if cancel is not None:
            self.cancellations.cancel(cancel.rid)

    # -- batches ----------------------------------------------------------------
    def _on_batch(self, msg: Msg) -> None:
        self._batch_arrived(msg.data, None)

    def _batch_arrived(self, data: bytes, channel: FrameSink | None) -> None:
        """A batch, over NATS or a local channel (`channel`: its completion goes back there)."""
        self._arrived[channel is not None] += 1
        try:
            batch = _batch_decoder.decode(data)
        except msgspec.DecodeError as exc:
            log.error("undecodable batch: %s", exc)
            return
        loaded = self.lifecycle.models.get((batch.model, batch.version))
        if loaded is None or not loaded.instances:
            message = f"model '{shown_name(batch.model)}' version {batch.version} is not loaded on worker {self.id}"
            self._tasks.spawn(self.batches.fail(batch, message, channel))
            return
        if batch.generation != loaded.generation:
            # sent on a credit of a generation retired meanwhile: run it on the current one,
            # outside its credits (the instance's thread still runs one batch at a time)
            instance = loaded.instances[batch.instance % len(loaded.instances)]
            instance.uncredited += 1
            self._run_batch(loaded, instance, batch, False, channel)
            return
        instance = loaded.instances[batch.instance]
        if batch.credit not in instance.idle:  # a duplicate credit: run it, but it returns no credit
            instance.uncredited += 1
            self._run_batch(loaded, instance, batch, False, channel)
            return
        instance.idle.discard(batch.credit)
        self._run_batch(loaded, instance, batch, True, channel)

    def _run_batch(
        self, loaded: LoadedModel, instance: Instance, batch: ExecBatch, holds_credit: bool, channel: FrameSink | None
    ) -> None:
        waits = self.batches.start(loaded, instance, batch, holds_credit, channel)
        if waits is not None:
            self._tasks.spawn(waits)


async def run(settings: WorkerSettings, stop: asyncio.Event) -> None:
    lifeline.die_with(settings.parent_pid)
    spans.install(spans.from_config(settings.trace_config), "worker", settings.worker_id)
    nc = await connection.connect(settings.nats_url, f"shoal-worker-{settings.worker_id}", settings.nats_credentials)
    try:
        await serve_until(stop, nc, WorkerService(settings, nc), "worker", settings.health_port)
    finally:
        spans.uninstall()
