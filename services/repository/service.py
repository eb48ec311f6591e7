"""The repository service: the bus side of the model manager.

It publishes `ModelRecord`s in the `shoal-models` KV bucket, reads the workers'
reports from `shoal-instances`, answers index/load/unload requests, and in poll mode
watches the repository directory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgspec
import watchfiles
from nats.aio.client import Client as NATS

from services.repository import ensembles
from services.repository.demand import Budget, OnDemand, Usage
from services.repository.drain import Drainer
from services.repository.manager import ModelManager
from services.repository.overrides import check_parameters
from services.repository.publishing import COLLECT_EVERY_S, FilePublisher
from services.repository.remote import RemoteError, RemoteRepository, is_remote
from services.repository.repositories import Repositories
from shared.bus import buckets, connection, discovery
from shared.bus.liveness import WorkerLiveness
from shared.errors import Code, ShoalError, unavailable
from shared.process import cache_dirs
from shared.process.runtime import serve_until
from shared.process.settings import RepositorySettings
from shared.wire import subjects
from shared.wire.control import (
    DemandRequest,
    IndexRequest,
    LoadRequest,
    LoadTime,
    MemoryUse,
    ModelUsage,
    RepositoryDone,
    StartupSet,
    UnloadRequest,
    UsageReply,
    WorkerBudget,
)
from shared.wire.messages import ErrorReply, encode
from shared.wire.records import InstanceRecord, ModelRecord, ModelState
from shared.wire.statistics import ReplicaCount
from shared.wire.status import RepositoryStatus

log = logging.getLogger("shoal.repository")

_instance_decoder = msgspec.msgpack.Decoder(InstanceRecord)
_usage_count = msgspec.json.Decoder(ReplicaCount)


def _replicas_declared(reply: bytes) -> int:
    """How many scheduler replicas a usage reply says there are (0: it cannot say)."""
    try:
        return _usage_count.decode(reply).replicas
    except msgspec.DecodeError:
        return 0


NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"
CONTROLLED = ("explicit", "on-demand")  # the modes that take load/unload requests


class RepositoryService:
    def __init__(self, settings: RepositorySettings, nc: NATS) -> None:
        self.settings = settings
        self.nc = nc
        # --model-files=store: each loaded version's files go into NATS for the workers of any host
        self.files = FilePublisher(nc) if settings.model_files == "store" else None
        drainer = Drainer(nc, settings.unload_timeout_s)
        # every --model-repository; a cloud bucket (s3://, gs://, as://) is read through a mirror on
        # this host's disk (remote.py)
        self.repositories = Repositories.open(
            settings.model_repository, cache_dirs.repository_mirrors(), settings.model_namespacing
        )
        self.manager = ModelManager(settings, self._publish, self._forget, drainer, self.files, self.repositories)
        self.liveness = WorkerLiveness(nc, settings.worker_timeout_s, self._worker_gone, self._worker_back)
        self.demand = OnDemand(self.manager, settings, self._usage, self._budgets)
        self._tasks: list[asyncio.Task] = []
        self._stop_watch = asyncio.Event()
        self.revisions: dict[str, int] = {}  # model -> KV revision of its latest record
        self.startup = StartupSet()  # what start published: gateways are not ready before they see it

    async def start(self) -> None:
        # a previous repository's records go now: gateways forget its start-up set and ask this one's
        await self.nc.publish(subjects.REPOSITORY_STARTING, b"")
        self.models_kv = await buckets.bucket(self.nc, subjects.MODELS_BUCKET)
        self.instances_kv = await buckets.bucket(self.nc, subjects.INSTANCES_BUCKET)
        for key in await self._keys(self.models_kv):  # a previous run's records
            await self.models_kv.delete(key)
        for name in self._initial_models():
            try:
                await self.manager.load(name)
                self.demand.pin(name)  # on-demand mode: --load-model is an explicit load
            except ShoalError as exc:
                log.error("%s", exc.message.strip())
        # every start-up model's record is published (ensembles' members loaded with them too)
        self.startup = StartupSet(max(self.revisions.values(), default=0), sorted(self.manager.records))
        if self.manager.on_demand:
            await self.manager.announce()
        await self.nc.subscribe(subjects.REPOSITORY_INDEX, cb=self._on_index)
        await self.nc.subscribe(subjects.REPOSITORY_DEMAND, cb=self._on_demand)
        await self.nc.subscribe(subjects.REPOSITORY_MODELS, cb=self._on_models)
        await self.nc.subscribe(subjects.REPOSITORY_LOAD, cb=self._on_load)
        await self.nc.subscribe(subjects.REPOSITORY_UNLOAD, cb=self._on_unload)
        await self.nc.subscribe(subjects.REPOSITORY_STARTED, cb=self._on_started)
        await self.liveness.start()
        self._tasks.append(asyncio.create_task(self._watch_instances()))
        if self.files is not None:
            self._tasks.append(asyncio.create_task(self._collect_files(self.files)))
        if self.settings.model_control_mode == "poll":
            self._tasks.append(asyncio.create_task(self._poll()))
        self.micro = await discovery.register(
            self.nc,
            "repository",
            "main",
            self.status,
            repository=self.repositories.describe(),
            mode=self.settings.model_control_mode,
        )
        log.info(
            "repository %s (%s mode): %d model(s) published",
            self.repositories.describe(),
            self.settings.model_control_mode,
            len(self.manager.records),
        )

    def status(self) -> RepositoryStatus:
        return RepositoryStatus(
            repository=self.repositories.describe(),
            mode=self.settings.model_control_mode,
            models={name: {v: s.state for v, s in r.versions.items()} for name, r in self.manager.records.items()},
            demand_loads=self.demand.loading(),
        )

    async def stop(self) -> None:
        await self.micro.stop()
        self._stop_watch.set()
        self.liveness.stop()
        for task in self._tasks:
            task.cancel()
        self.manager.remove_override_dirs()

    @staticmethod
    async def _keys(kv) -> list[str]:
        return await buckets.keys(kv)

    def _initial_models(self) -> list[str]:
        available = self.manager.available()
        if self.settings.model_control_mode not in CONTROLLED:
            return available
        wanted = self.settings.load_model
        if "*" in wanted:
            return available
        keys = {name: [key for key in self.manager.to_load(name) if key in available] for name in wanted}
        missing = [name for name, found in keys.items() if not found]
        if missing:
            log.error("--load-model: %s not in the repository", ", ".join(missing))
        return [key for found in keys.values() for key in found]

    # -- the bus ------------------------------------------------------------------------
    async def _publish(self, record: ModelRecord) -> None:
        self.revisions[record.name] = await buckets.put(self.models_kv, subjects.model_key(record.name), encode(record))

    async def _forget(self, name: str) -> None:
        await buckets.delete(self.models_kv, subjects.model_key(name))

    async def _watch_instances(self) -> None:
        async for change in buckets.watch(self.nc, self.instances_kv):
            if not change.key:
                continue
            report = _instance_decoder.decode(change.value) if change.value is not None else None
            if report is not None:
                self.liveness.seen.setdefault(report.worker, time.monotonic())
            await self.manager.on_report(change.key, report)

    async def _worker_gone(self, worker: str) -> None:
        """A worker that is gone (its connection closed, or silent past the liveness rules: crashed,
        partitioned, stuck) no longer counts as an instance."""
        level = logging.INFO if self.liveness.stopped_on_purpose(worker) else logging.WARNING
        log.log(level, "worker %s is gone; dropping its instances", worker)
        for key in [k for k, r in self.manager.reports.items() if r.worker == worker]:
            await self.instances_kv.delete(key)

    async def _worker_back(self, worker: str) -> None:
        await self.nc.publish(subjects.worker_report(worker), b"")  # its reports were deleted

    async def _reply(self, msg, error: ShoalError | None = None, revision: int = 0) -> None:
        """An error, or the KV revision a gateway must have seen before it answers the client."""
        payload = (
            encode(ErrorReply(error.message, str(error.code)))
            if error
            else msgspec.json.encode(RepositoryDone(revision))
        )
        await self.nc.publish(msg.reply, payload)

    async def _on_started(self, msg) -> None:
        await self.nc.publish(msg.reply, msgspec.json.encode(self.startup))

    async def _on_index(self, msg) -> None:
        await self._on_index_changed()
        ready_only = False
        if msg.data:
            try:
                ready_only = msgspec.json.decode(msg.data, type=IndexRequest).ready
            except msgspec.DecodeError:  # as Triton: a body it cannot read asks for every model
                pass
        await self.nc.publish(msg.reply, msgspec.json.encode(self.manager.index(ready_only)))

    async def _on_index_changed(self) -> None:
        if self.manager.on_demand:
            await self.manager.announce()  # models added to the repository since

    async def _on_demand(self, msg) -> None:
        asyncio.create_task(self._answer(msg, self._demand(msg.data)))

    async def _demand(self, data: bytes) -> str:
        body = msgspec.json.decode(data, type=DemandRequest)
        name = body.name
        if not self.manager.on_demand:
            raise unavailable(f"model '{name}' is not loaded and --model-control-mode is not on-demand")
        await self.demand.ensure(name, min(body.timeout_s, self.settings.load_timeout_s))
        return name

    async def _on_models(self, msg) -> None:
        """On-demand figures and every loaded model's measured memory, for the gateways' /metrics."""
        figures = self.demand.figures()
        figures.memory = [
            MemoryUse(r.model, r.version, r.worker, r.rss_bytes, r.device_bytes)
            for r in self.manager.reports.values()
            if r.serving_generation and (r.rss_bytes or r.device_bytes)
        ]
        figures.budgets = {w: WorkerBudget(b.budget_bytes, b.max_models) for w, b in self._budgets().items()}
        figures.load_times = load_times(self.manager.reports.values(), self.manager.records)
        await self.nc.publish(msg.reply, msgspec.json.encode(figures))

    async def _usage(self) -> Usage:
        """Every scheduler replica's view of the models it serves: in use, last used."""
        merged: Usage = {}
        replies = await connection.gather(self.nc, subjects.SCHEDULER_USAGE, timeout=1.0, declared=_replicas_declared)
        for reply in replies:
            try:
                models = msgspec.json.decode(reply, type=UsageReply).models
            except msgspec.DecodeError as exc:  # one replica's unreadable answer costs only its figures
                log.warning("unreadable usage reply from a scheduler: %s", exc)
                continue
            for model, usage in models.items():
                known = merged.setdefault(model, ModelUsage())
                known.busy = known.busy or usage.busy
                known.last_used_ms = max(known.last_used_ms, usage.last_used_ms)
        return merged

    def _budgets(self) -> dict[str, Budget]:
        """The live workers on-demand placement may choose (not a python model's own process)."""
        beats = self.liveness.beats
        return {w: Budget.of(beats[w]) for w in self.liveness.seen if w in beats and beats[w].placeable}

    async def _on_load(self, msg) -> None:
        asyncio.create_task(self._answer(msg, self._load(msg.data)))  # a load takes long: never block the others

    async def _on_unload(self, msg) -> None:
        asyncio.create_task(self._answer(msg, self._unload(msg.data)))

    async def _answer(self, msg, work) -> None:
        try:
            await work
            # the last record this repository wrote, not just the model's: an unload with
            # unload_dependents (or a load that pulls in an ensemble's members) changes several
            # records, and the gateway answers only once it has seen all of them
            await self._reply(msg, revision=max(self.revisions.values(), default=0))
        except ShoalError as exc:
            await self._reply(msg, exc)
        except Exception as exc:
            log.exception("load/unload failed")
            await self._reply(msg, ShoalError(f"internal error: {exc}", Code.INTERNAL))

    async def _load(self, data: bytes) -> str:
        if self.settings.model_control_mode not in CONTROLLED:
            raise unavailable(NOT_EXPLICIT)
        body = msgspec.json.decode(data, type=LoadRequest)
        config, files = check_parameters(body.parameters)
        # with namespacing every repository's model of that name loads, together; the answer waits
        # for all of them, as Triton's
        keys = self.manager.to_load(body.name, bool(files))
        done = await asyncio.gather(*(self._load_one(key, config, files) for key in keys), return_exceptions=True)
        for outcome in done:
            if isinstance(outcome, BaseException) and not isinstance(outcome, ShoalError):
                raise outcome
        failed = [outcome for outcome in done if isinstance(outcome, ShoalError)]
        if failed:  # Triton's text: one line per model that failed
            raise ShoalError("".join(exc.message for exc in failed), failed[0].code)
        return body.name

    async def _load_one(self, name: str, config: str, files: dict[str, str]) -> None:
        if self.manager.on_demand and not (config or files) and await self.demand.is_ensemble(name):
            await self.demand.ensure(name, self.settings.load_timeout_s)  # its members placed under the budgets
            self.demand.pin(name)
            return
        async with self.manager.lock(name):
            record = await self.manager.load(name, config, files)
            self.demand.pin(name)  # on-demand mode: an explicit load stays until unloaded
            # an ensemble's steps it loaded (every repository's, by name) settle first, failed or not
            await self.manager.wait_settled(self.manager.pulled.pop(name, []), self.settings.load_timeout_s)
            await self.manager.wait_loaded(name, record.generation, self.settings.load_timeout_s)

    async def _unload(self, data: bytes) -> str:
        if self.settings.model_control_mode not in CONTROLLED:
            raise unavailable(NOT_EXPLICIT)
        body = msgspec.json.decode(data, type=UnloadRequest)
        for name in self.manager.to_unload(body.name):  # with namespacing: every repository's
            await self._unload_one(name, body.unload_dependents)
        return body.name

    async def _unload_one(self, name: str, unload_dependents: bool) -> None:
        self.demand.unpin(name)
        async with self.manager.lock(name):
            record = self.manager.records.get(name)
            await self.manager.unload(name)
        if unload_dependents and ensembles.record_is_ensemble(record):
            # the composing models go too, unless another loaded ensemble still uses them
            for member in ensembles.members_of(record):
                if not [d for d in ensembles.dependents(member, self.manager.records) if d != name]:
                    async with self.manager.lock(member):
                        await self.manager.unload(member)

    # -- poll mode ------------------------------------------------------------------------
    async def _collect_files(self, files: FilePublisher) -> None:
        """Model files no record names any more leave the object store (publishing.py)."""
        while True:
            await asyncio.sleep(COLLECT_EVERY_S)
            try:
                await files.collect(list(self.manager.records.values()))
            except Exception as exc:  # the bus is away: next time
                log.warning("could not collect unused model files: %s", exc)

    async def _poll(self) -> None:
        """React to file events (debounced), and rescan every --repository-poll-secs regardless."""
        changes = watchfiles.awatch(
            *self.repositories.roots,
            stop_event=self._stop_watch,
            debounce=500,
            step=100,
            recursive=True,
            raise_interrupt=False,
        )
        ticker = asyncio.create_task(self._tick())
        try:
            async for _ in changes:
                await self.manager.poll()
        finally:
            ticker.cancel()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(max(1, self.settings.repository_poll_secs))
            await self.manager.poll()


async def run(settings: RepositorySettings, stop: asyncio.Event) -> None:
    if not settings.model_repository:
        raise SystemExit("no --model-repository given")
    for repository in settings.model_repository:
        if is_remote(repository):
            try:  # the whole bucket, before anything is published
                await asyncio.to_thread(RemoteRepository(repository, cache_dirs.repository_mirrors()).sync)
            except RemoteError as exc:
                raise SystemExit(f"failed to poll model repository '{repository}': {exc}") from None
        elif not Path(repository).is_dir():
            raise SystemExit(f"model repository '{repository}' is not a directory")
    nc = await connection.connect(settings.nats_url, "shoal-repository", settings.nats_credentials)
    await serve_until(stop, nc, RepositoryService(settings, nc), "repository", settings.health_port)


def load_times(reports: Iterable[InstanceRecord], records: Mapping[str, ModelRecord]) -> list[LoadTime]:
    """Each READY version, with its slowest worker's load time: Triton's one
    `nv_model_load_duration_secs` sample per model version, where several workers loaded it. Its
    record's state decides, not the reports: an unload answered has the version UNAVAILABLE
    at once, while the workers' reports that they let it go come a moment later (and Triton's
    sample is gone when its unload returns)."""
    slowest: dict[tuple[str, int], float] = {}
    for r in reports:
        record = records.get(r.model)
        state = record.versions.get(str(r.version)) if record is not None else None
        if r.serving_generation and r.load_s and state is not None and state.state == ModelState.READY:
            key = (r.model, r.version)
            slowest[key] = max(slowest.get(key, 0.0), r.load_s)
    return [LoadTime(model, version, seconds) for (model, version), seconds in sorted(slowest.items())]
