"""Which model versions a worker hosts: load, warm up, swap generations, unload, report.

The repository publishes what to host (`ModelRecord.hosted` at `generation`); this
module makes it so and reports each version's state in the instances KV bucket. A
reload loads the new generation next to the old one, swaps when it is ready (the old
instances finish what they run, then close), and keeps the old one if the new fails.
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import gc
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
from nats.aio.client import Client as NATS

from services.worker import backends
from services.worker.backends import Placement
from services.worker.background_tasks import BackgroundTasks
from services.worker.batches.instance_thread import InstanceThread
from services.worker.batches.instances import Instance, LoadedModel
from services.worker.gpus import available_gpus
from services.worker.loading import BoundedLoader
from services.worker.model_files import ModelFiles
from services.worker.placement import group_size, plan_instances
from services.worker.python.hosting.callables import InProcessModels, in_process
from services.worker.python.processes import execution_environments
from services.worker.python.processes.child_reports import ChildReports
from services.worker.python.processes.isolation import ModelProcesses, isolated
from services.worker.readiness import UserReadiness, instances_ready
from services.worker.sequences.state import StateStore
from services.worker.warmup import run_warmup
from shared.bus import buckets, file_store
from shared.config import backend_config
from shared.config.model_config import ModelSpec, load_error, spec_from_json
from shared.config.sequence_config import sequence_config
from shared.errors import unavailable
from shared.memory import footprint
from shared.process.settings import WorkerSettings
from shared.wire import subjects
from shared.wire.messages import WorkerExited, encode
from shared.wire.records import InstanceRecord, ModelRecord, ModelState

log = logging.getLogger("shoal.worker")
_record_decoder = msgspec.msgpack.Decoder(ModelRecord)

Key = tuple[str, int]
Hook = Callable[[LoadedModel], Awaitable[None]]


class ModelLifecycle:
    def __init__(
        self,
        worker_id: str,
        settings: WorkerSettings,
        nc: NATS,
        on_ready: Hook,
        on_retired: Hook,
        local: InProcessModels | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.local = local  # a process serving its own bound functions (shoal.pytriton): hosts only those
        self.settings = settings
        self.nc = nc
        self.on_ready = on_ready
        self.on_retired = on_retired
        self.models: dict[Key, LoadedModel] = {}
        self._attempted: dict[Key, int] = {}  # generation last loaded or tried
        self._records: dict[str, ModelRecord] = {}
        self._user_readiness: dict[int, UserReadiness] = {}  # id(runner) -> its is_ready() checks
        self._tasks = BackgroundTasks()
        self.processes = ModelProcesses(settings, worker_id, self._child_crashed)
        self.loader = BoundedLoader(settings.model_load_thread_count)
        self.files = ModelFiles(nc, settings.model_cache_dir)  # --model-files=store: fetched from NATS
        self.backend_config = backend_config.parse(settings.backend_config)
        self._said_unread: set[tuple[str, str]] = set()

    async def start(self) -> None:
        self.instances_kv = await buckets.bucket(self.nc, subjects.INSTANCES_BUCKET)
        self.child_reports = ChildReports(self.instances_kv, self.worker_id)
        self.models_kv = await buckets.bucket(self.nc, subjects.MODELS_BUCKET, create=False)
        self._tasks.spawn(self._watch())

    async def stop(self) -> None:
        self._tasks.cancel_all()
        self.loader.shutdown()
        await self.processes.stop_all()  # first: a child exiting now is not a crash to restart
        for key in list(self.models):  # one collection at the end: hundreds of models must stop quickly
            await self.unload(key, collect=False)
        gc.collect()

    async def report_all(self) -> None:
        """Report every hosted version again (the repository lost our reports, e.g. after a pause)."""
        for key, loaded in list(self.models.items()):
            record = self._records.get(key[0])
            if record is not None and self._attempted.get(key) == record.generation:
                state = ModelState.READY if loaded.generation == record.generation else ModelState.LOADING
                await self.report(record, key[1], state, count=len(loaded.instances))

    async def _child_crashed(self, model: str, child_id: str, code: int, lived_s: float) -> bool:
        record = self._records.get(model)
        crashed_loading = False
        if record is not None:  # its reports first: they say whether it died loading (then they go)
            group_id = self.processes.group_id(model)
            group = (group_id, group_size(record.config)) if child_id != group_id else None  # one instance's
            crashed_loading = await self.child_reports.crashed(record, child_id, code, lived_s, group)
        # the schedulers fail its batches at once and send the next ones to the other instances
        await self.nc.publish(subjects.WORKER_EXITED, encode(WorkerExited(child_id, code)))
        if record is None:
            return False
        current = self._records.get(model)
        if crashed_loading and (current is None or current.generation != record.generation):
            await self.child_reports.forget(model, record.hosted)  # a new load began meanwhile: it decides
            return False
        return crashed_loading

    async def readiness(self, model: str, version: int) -> tuple[bool, str]:
        """The hosted instances' own `is_ready()` answers (ready when none has one)."""
        loaded = self.models.get((model, version))
        if loaded is None:
            return True, ""
        live = {id(i.runner): i for hosted in self.models.values() for i in hosted.instances}
        for stale in [k for k in self._user_readiness if k not in live]:
            del self._user_readiness[stale]
        checks = []
        for instance in loaded.instances:
            if instance.closed or not instance.runner.checks_readiness:
                continue
            check = self._user_readiness.get(id(instance.runner))
            if check is None or check.runner is not instance.runner:
                check = self._user_readiness[id(instance.runner)] = UserReadiness(instance.runner)
            checks.append((instance.name or model, check))
        return await instances_ready(checks) if checks else (True, "")

    async def _watch(self) -> None:
        async for change in buckets.watch(self.nc, self.models_kv):
            if not change.key:
                continue
            record = _record_decoder.decode(change.value) if change.value is not None else None
            name = subjects.untoken(change.key)
            if record is None:
                self._records.pop(name, None)
            else:
                self._records[name] = record
            await self.apply(name, record)

    def placed_here(self, record: ModelRecord) -> bool:
        """On-demand placement names the workers that host a model (none named: every worker). A
        python model's own process follows the worker that started it, which checked already."""
        return not record.workers or self.worker_id in record.workers or self.settings.parent_pid != 0

    def hosts(self, name: str, config: dict | None = None) -> bool:
        """This worker's selector (`--models` globs): by default it hosts every model, except the
        functions other processes bound (only the process that bound one can run it)."""
        if self.local is not None:
            return self.local.hosts(name)
        if config is not None and in_process(config):
            return False
        return not self.settings.models or any(fnmatch.fnmatchcase(name, p) for p in self.settings.models)

    async def apply(self, name: str, record: ModelRecord | None) -> None:
        # an ensemble has no instances: the scheduler runs it (services/scheduler/ensembles/ensemble_runner.py)
        hosted = record
        if (
            record is None
            or record.reason
            or not self.hosts(name, record.config)
            or not self.placed_here(record)
            or record.active_config.get("platform") == "ensemble"
            or self._instance_dropped(record)
        ):
            hosted = None
        if hosted is not None and isolated(self.settings, hosted.config):
            # its EXECUTION_ENV_PATH, unpacked if packed (once): off the event loop; the model's
            # directory on this host (fetched from NATS: model_files.py), which its process loads from too
            try:
                model_dir = str((await self.files.directory(hosted)).path)
                environ = await asyncio.to_thread(execution_environments.process_environ, hosted.config, model_dir)
            except (file_store.FetchError, OSError, ValueError) as exc:  # its process reports the failure
                # nothing unpacked from files that were not checked (docs/security.md, "Model files")
                log.error("the files of '%s' could not be had: %s", name, exc)
                environ = {}
            if self.processes.environ_changed(name, environ):
                await self.processes.stop(name)
            # worker processes of its own host it: one per instance, or one for the whole model
            if await self.processes.ensure(name, hosted.generation, environ, self._instance_processes(hosted)):
                await self.child_reports.forget(name, hosted.hosted)
            hosted = None
        elif self.processes.hosts(name):
            self._tasks.spawn(self.processes.stop(name))  # up to its stop timeout: other models go on meanwhile
            await self.child_reports.forget(name, [])
        wanted = set(hosted.hosted) if hosted is not None else set()
        for key in [k for k in self._attempted if k[0] == name and k[1] not in wanted]:
            self._attempted.pop(key, None)
            await self.unload(key)
        if hosted is not None:
            self._load_new(name, hosted, wanted)

    def _instance_dropped(self, record: ModelRecord) -> bool:
        """The process of an instance the model no longer has (a reload to a lower count): it
        unloads, and the worker that started it stops it; it must not fail the new generation."""
        return 0 <= self.settings.instance_index and group_size(record.config) <= self.settings.instance_index

    def _instance_processes(self, record: ModelRecord) -> int | None:
        """How many processes an isolated model gets: one per instance (`--python-isolation
        instance`), or None for one process with every instance (`model`)."""
        if self.settings.python_isolation != "instance":
            return None
        return group_size(record.config)

    def _load_new(self, name: str, record: ModelRecord, versions: set[int]) -> None:
        for version in versions:
            key = (name, version)
            if self._attempted.get(key) == record.generation:
                continue  # loaded, loading, or failed at this generation: a state change, not a reload
            self._attempted[key] = record.generation
            self._tasks.spawn(self._load(record, version))

    async def _load(self, record: ModelRecord, version: int) -> None:
        key = (record.name, version)
        await self.report(record, version, ModelState.LOADING)
        started = time.perf_counter()
        tries = 1 + max(0, self.settings.model_load_retry_count)  # tritonserver's --model-load-retry-count
        for attempt in range(1, tries + 1):
            attempt_ns = time.monotonic_ns()  # the load time is the attempt that succeeded, as Triton's
            try:
                spec = spec_from_json(record.config, record.name)
                fetched = await self.files.directory(record)  # the repository's path, or this host's copy
                create = functools.partial(self._create, spec, record, version, fetched.path)
                loaded = await self.loader.run(create)
                loaded.load_s = (time.monotonic_ns() - attempt_ns) / 1e9
                break
            except Exception as exc:
                reason = load_error(record.name, exc)
                log.error("failed to load '%s' version %d: %s", record.name, version, reason)
                if self._attempted.get(key) != record.generation:  # superseded or unloaded meanwhile
                    return
                if attempt < tries:
                    log.info(
                        "retrying the load of '%s' version %d (%d of %d)", record.name, version, attempt, tries - 1
                    )
                    continue
                await self.report(record, version, ModelState.UNAVAILABLE, reason)
                return
        if self._attempted.get(key) != record.generation:  # superseded or unloaded while loading
            loaded.close()
            return
        old = self.models.get(key)
        self.models[key] = loaded
        if old is not None:
            old.retire()
            await self.on_retired(old)
        await self.report(record, version, ModelState.READY, count=len(loaded.instances))
        log.info(
            "loaded '%s' version %d (generation %d): %d instance(s) in %.0f ms, warmup %.1f ms, %.1f MiB%s",
            record.name,
            version,
            record.generation,
            len(loaded.instances),
            (time.perf_counter() - started) * 1000,
            loaded.warmup_ms,
            (loaded.rss_bytes + loaded.device_bytes) / (1 << 20),
            f" (files: {fetched.bytes_fetched / (1 << 20):.1f} MiB fetched in {fetched.seconds * 1000:.0f} ms)"
            if fetched.bytes_fetched
            else "",
        )
        await self.on_ready(loaded)

    def _create(self, spec: ModelSpec, record: ModelRecord, version: int, model_dir: Path) -> LoadedModel:
        backend = self.local or backends.load_backend(spec.backend or "onnxruntime", self.settings.backend_directory)
        # every group's instances, each with its own kind and device (Triton's instance_group)
        plans = plan_instances(record.config, available_gpus())
        threads = self.settings.intra_op_threads or backend.default_threads(len(plans))
        hosted = list(enumerate(plans))  # (index in the model's instances, plan)
        if self.settings.instance_index >= 0:  # the process of one instance (--python-isolation instance)
            if self.settings.instance_index >= len(plans):
                raise unavailable(
                    f"model '{spec.model_name}' has {len(plans)} instance(s), not {self.settings.instance_index + 1}"
                )
            hosted = [hosted[self.settings.instance_index]]
        settings = backend_config.settings_for(self.backend_config, spec.backend)
        self._say_unread(spec.backend, settings)
        loaded = LoadedModel(spec, version, record.generation)
        loaded.sequence = sequence_config(record.config)
        if loaded.sequence is not None:
            loaded.states = StateStore(loaded.sequence, model_dir / str(version) / "initial_state")
        # what the model costs: the process's memory before and after its instances exist (loads
        # running beside this one blur it; on-demand mode loads one model at a time per worker), or
        # the whole process where it exists only for this model (a python model's or instance's)
        rss, device = footprint.rss_bytes(), footprint.device_bytes()
        try:
            for index, plan in hosted:
                runner = backend.create(
                    spec, model_dir, Placement(version, plan.kind, plan.device, threads, plan.name, index, settings)
                )
                executor = InstanceThread(f"{spec.name}-{index}")
                loaded.instances.append(
                    Instance(
                        len(loaded.instances),  # its index in this worker: its credits
                        runner,
                        executor,
                        max(1, self.settings.credits_per_instance),
                        name=plan.name,
                        kind=plan.kind,
                        device=plan.device,
                    )
                )
            if record.config.get("model_warmup"):
                started = time.perf_counter()
                run_warmup(loaded, record.config, model_dir)
                loaded.warmup_ms = (time.perf_counter() - started) * 1000
            if self.settings.parent_pid:  # a python model's (or instance's) own process: all of it is the model's
                loaded.rss_bytes = footprint.proportional_bytes()
            else:
                loaded.rss_bytes = max(0, footprint.rss_bytes() - rss)
            loaded.device_bytes = max(0, footprint.device_bytes() - device)
        except Exception:
            loaded.close()
            raise
        return loaded

    def _say_unread(self, backend: str, settings: dict[str, str]) -> None:
        """--backend-config settings no part of Shoal reads: accepted, as Triton's backends accept
        the ones they do not know, and said once per backend and setting."""
        python_based = backend_config.python_based_runtime(self.settings.backend_directory, backend) is not None
        for key in backend_config.unread(settings, backend, python_based):
            if (backend, key) not in self._said_unread:
                self._said_unread.add((backend, key))
                log.warning("--backend-config %s setting '%s' has no effect in Shoal", backend or "(global)", key)

    async def unload(self, key: Key, collect: bool = True) -> None:
        loaded = self.models.pop(key, None)
        if loaded is None:
            await self.instances_kv.delete(subjects.instance_key(self.worker_id, *key))
            return
        loaded.retire()
        await self.on_retired(loaded)
        await self.instances_kv.delete(subjects.instance_key(self.worker_id, *key))
        if collect:
            gc.collect()  # sessions hold large native buffers: return them now, not at some later GC
        log.info("unloaded '%s' version %d", *key)

    async def report(
        self, record: ModelRecord, version: int, state: ModelState, reason: str = "", count: int = 0
    ) -> None:
        serving = self.models.get((record.name, version))
        report = InstanceRecord(
            self.worker_id,
            record.name,
            version,
            record.generation,
            state,
            reason,
            count,
            serving_generation=serving.generation if serving else 0,
            warmup_ms=serving.warmup_ms if serving else 0.0,
            load_s=serving.load_s if serving else 0.0,
            rss_bytes=serving.rss_bytes if serving else 0,
            device_bytes=serving.device_bytes if serving else 0,
            group=self.settings.instance_group,
            group_size=group_size(record.config) if self.settings.instance_group else 0,
        )
        await buckets.put(
            self.instances_kv, subjects.instance_key(self.worker_id, record.name, version), encode(report)
        )
