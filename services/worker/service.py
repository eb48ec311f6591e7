"""The worker: hosts model instances, runs the batches the scheduler sends.

Each instance runs on its own thread (native backends release the GIL). After a
batch the worker replies straight to each request's gateway inbox, then tells the
scheduler the instance is free (with the batch's timings), which is also the
credit for the next batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from nats.aio.client import Client as NATS

from services.worker import backends
from services.worker.batch import gather, scatter
from services.worker.replies import Replies
from shared import bus, subjects
from shared.datatypes import from_bytes, protocol_dtype, to_bytes
from shared.errors import ShoalError
from shared.messages import (
    ExecBatch,
    InferRequest,
    InferResponse,
    InstanceFree,
    InstanceRecord,
    ModelRecord,
    TensorRef,
    WorkerHeartbeat,
    encode,
)
from shared.model_config import ModelSpec, load_error, spec_from_json
from shared.runtime import serve_until
from shared.settings import WorkerSettings
from shared.tensors import TensorStore

log = logging.getLogger("shoal.worker")

_batch_decoder = msgspec.msgpack.Decoder(ExecBatch)
_request_decoder = msgspec.msgpack.Decoder(InferRequest)
_record_decoder = msgspec.msgpack.Decoder(ModelRecord)


@dataclass
class Instance:
    index: int
    runner: Any
    executor: ThreadPoolExecutor
    credits: int
    idle: set[int] = field(default_factory=set)  # credits not held by a batch

    def __post_init__(self) -> None:
        self.idle = set(range(self.credits))

    @property
    def busy(self) -> bool:
        return len(self.idle) < self.credits


@dataclass
class LoadedModel:
    spec: ModelSpec
    version: int
    generation: int
    instances: list[Instance] = field(default_factory=list)
    retired: bool = False


@dataclass
class _Timings:
    compute_input_ns: int = 0
    compute_infer_ns: int = 0


class WorkerService:
    def __init__(self, settings: WorkerSettings, nc: NATS) -> None:
        self.settings = settings
        self.nc = nc
        # one id per process incarnation: a restarted worker must not inherit the
        # batches its predecessor never finished
        self.id = f"{settings.worker_id}-{uuid.uuid4().hex[:6]}"
        self.subject = subjects.worker_exec(self.id)
        self.store = TensorStore(nc, self.id, settings.inline_max_bytes, settings.tensor_transport)
        self.models: dict[tuple[str, int], LoadedModel] = {}
        self._loading: dict[tuple[str, int], asyncio.Task] = {}
        self._attempted: dict[tuple[str, int], int] = {}  # generation last loaded or tried
        self._tasks: set[asyncio.Task] = set()
        self._loop = asyncio.get_running_loop()

    async def start(self) -> None:
        await self.store.start()
        self.instances_kv = await bus.bucket(self.nc, subjects.INSTANCES_BUCKET)
        self.models_kv = await bus.bucket(self.nc, subjects.MODELS_BUCKET)
        await self.nc.subscribe(self.subject, cb=self._on_batch)
        await self.nc.subscribe(subjects.RESYNC, cb=self._on_resync)
        self._spawn(self._watch_models())
        self._spawn(self._heartbeat())
        log.info("worker %s started", self.id)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for key in list(self.models):
            await self._unload(key)
        await self.store.close()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- model lifecycle ---------------------------------------------------
    async def _watch_models(self) -> None:
        async for key, value in bus.watch(self.models_kv):
            name = subjects.untoken(key)
            record = _record_decoder.decode(value) if value is not None else None
            await self._apply(name, record)

    async def _apply(self, name: str, record: ModelRecord | None) -> None:
        wanted: set[int] = set()
        if record is not None and not record.reason:
            wanted = {int(v) for v, s in record.versions.items() if s.state != "UNLOADING"}
        for key in [k for k in self._attempted if k[0] == name and k[1] not in wanted]:
            self._attempted.pop(key, None)
            await self._unload(key)
        for version in wanted:
            key = (name, version)
            if self._attempted.get(key) == record.generation:
                continue  # loaded, loading, or failed at this generation: a state change, not a reload
            self._attempted[key] = record.generation
            if key in self._loading:
                self._loading[key].cancel()
            self._loading[key] = self._spawn(self._load(record, version))

    async def _load(self, record: ModelRecord, version: int) -> None:
        key = (record.name, version)
        await self._report(record, version, "LOADING")
        try:
            spec = spec_from_json(record.config)
            loaded = await asyncio.to_thread(self._create, spec, Path(record.path), version, record.generation)
        except Exception as exc:
            reason = load_error(record.name, exc)
            log.error("failed to load '%s' version %d: %s", record.name, version, reason)
            await self._report(record, version, "UNAVAILABLE", reason)
            return
        finally:
            self._loading.pop(key, None)
        old = self.models.get(key)
        self.models[key] = loaded
        if old is not None:
            self._retire(old)
        await self._report(record, version, "READY", count=len(loaded.instances))
        log.info("loaded '%s' version %d: %d instance(s)", record.name, version, len(loaded.instances))
        await self._grant_idle(loaded)

    def _create(self, spec: ModelSpec, model_dir: Path, version: int, generation: int) -> LoadedModel:
        backend = backends.load_backend(spec.backend or "onnxruntime")
        threads = self.settings.intra_op_threads or backend.default_threads(spec.instance_count)
        loaded = LoadedModel(spec, version, generation)
        try:
            for index in range(spec.instance_count):
                runner = backend.create_instance(spec, model_dir, version, spec.instance_kind, 0, threads)
                executor = ThreadPoolExecutor(1, thread_name_prefix=f"{spec.name}-{index}")
                loaded.instances.append(Instance(index, runner, executor, max(1, self.settings.credits_per_instance)))
        except Exception:
            self._close(loaded)
            raise
        return loaded

    def _retire(self, loaded: LoadedModel) -> None:
        """Stop giving credits; close each instance once its running batch (if any) ends."""
        loaded.retired = True
        for instance in loaded.instances:
            if not instance.busy:
                self._close_instance(instance)

    @staticmethod
    def _close_instance(instance: Instance) -> None:
        instance.executor.shutdown(wait=False)
        instance.runner.close()

    def _close(self, loaded: LoadedModel) -> None:
        for instance in loaded.instances:
            self._close_instance(instance)

    async def _unload(self, key: tuple[str, int]) -> None:
        loaded = self.models.pop(key, None)
        if loaded is not None:
            self._retire(loaded)
            await self.instances_kv.delete(subjects.instance_key(self.id, *key))
            log.info("unloaded '%s' version %d", *key)

    async def _report(self, record: ModelRecord, version: int, state: str, reason: str = "", count: int = 0) -> None:
        report = InstanceRecord(self.id, record.name, version, record.generation, state, reason, count)
        await self.instances_kv.put(subjects.instance_key(self.id, record.name, version), encode(report))

    # -- scheduling ----------------------------------------------------------
    async def _grant_idle(self, loaded: LoadedModel) -> None:
        """Announce every idle credit; first credits of all instances first, so batches spread."""
        if loaded.retired:
            return
        for credit in range(max(i.credits for i in loaded.instances)):
            for instance in loaded.instances:
                if credit in instance.idle:
                    free = InstanceFree(self.id, loaded.spec.name, loaded.version, instance.index, self.subject, credit)
                    await self.nc.publish(subjects.INSTANCE_FREE, encode(free))

    async def _on_resync(self, msg) -> None:
        for loaded in list(self.models.values()):
            await self._grant_idle(loaded)

    async def _heartbeat(self) -> None:
        while True:
            instances = {f"{m}/{v}": len(loaded.instances) for (m, v), loaded in self.models.items()}
            beat = WorkerHeartbeat(self.id, self.subject, self.store.host, instances, self.settings.heartbeat_s)
            await self.nc.publish(subjects.WORKER_HEARTBEAT, encode(beat))
            await asyncio.sleep(self.settings.heartbeat_s)

    async def _on_batch(self, msg) -> None:
        try:
            batch = _batch_decoder.decode(msg.data)
        except msgspec.DecodeError as exc:
            log.error("undecodable batch: %s", exc)
            return
        loaded = self.models.get((batch.model, batch.version))
        if loaded is None or batch.instance >= len(loaded.instances):
            await self._fail_batch(batch, f"model '{batch.model}' version {batch.version} is not loaded on worker {self.id}")
            return
        instance = loaded.instances[batch.instance]
        instance.idle.discard(batch.credit)
        self._spawn(self._execute(loaded, instance, batch))

    async def _fail_batch(self, batch: ExecBatch, message: str) -> None:
        replies = Replies(batch.reply_via_scheduler)
        for raw in batch.requests:
            request = _request_decoder.decode(raw)
            replies.add(request, InferResponse(request.rid, error=message, code="UNAVAILABLE"))
        await replies.send(self.nc)
        # instance -1: not a credit, the scheduler must not send here again
        free = InstanceFree(self.id, batch.model, batch.version, -1, self.subject, batch.credit, batch.batch_id,
                            done=replies.done)
        await self.nc.publish(subjects.INSTANCE_FREE, encode(free))

    async def _execute(self, loaded: LoadedModel, instance: Instance, batch: ExecBatch) -> None:
        free = InstanceFree(self.id, batch.model, batch.version, batch.instance, self.subject, batch.credit,
                            batch.batch_id)
        replies = Replies(batch.reply_via_scheduler)
        requests = [_request_decoder.decode(raw) for raw in batch.requests]
        try:
            now = time.time_ns()
            live = [r for r in requests if r.deadline_ns > now]
            for request in requests:
                if request.deadline_ns <= now:
                    replies.skip(request)
            if live:
                await self._run_batch(loaded, instance, live, free, replies)
        except Exception as exc:  # never lose a request: every one gets an answer
            log.exception("batch %d of '%s' failed", batch.batch_id, batch.model)
            answered = replies.answered()
            code = exc.code if isinstance(exc, ShoalError) else "INTERNAL"
            for request in requests:
                if request.rid not in answered:
                    replies.add(request, InferResponse(request.rid, error=str(exc), code=code))
        finally:
            instance.idle.add(batch.credit)
            if loaded.retired and not instance.busy:
                self._close_instance(instance)
            if loaded.retired:
                free.instance = -1  # tells the scheduler this is not a credit
            await replies.send(self.nc)
            free.done = replies.done
            await self.nc.publish(subjects.INSTANCE_FREE, encode(free))

    async def _run_batch(
        self, loaded: LoadedModel, instance: Instance, requests: list[InferRequest], free: InstanceFree,
        replies: Replies,
    ) -> None:
        spec = loaded.spec
        t0 = time.perf_counter_ns()
        timeout = max(0.1, (min(r.deadline_ns for r in requests) - time.time_ns()) / 1e9)
        buffers = [[await self.store.get(ref, timeout) for ref in r.inputs] for r in requests]
        names = sorted({n for r in requests for n in (r.outputs or [o.name for o in spec.outputs])})
        sizes = [r.batch_size for r in requests]
        timings = _Timings()
        pieces = await self._loop.run_in_executor(
            instance.executor, self._compute, spec, instance, requests, buffers, names, sizes, timings, t0
        )
        free.batch_size = sum(sizes)
        free.compute_input_ns = timings.compute_input_ns
        free.compute_infer_ns = timings.compute_infer_ns
        t_out = time.perf_counter_ns()
        for request, piece in zip(requests, pieces):
            replies.add(request, self._respond(spec, loaded.version, request, piece))
        free.compute_output_ns = time.perf_counter_ns() - t_out

    @staticmethod
    def _compute(spec, instance, requests, buffers, names, sizes, timings: _Timings, t0: int):
        arrays = [
            {ref.name: from_bytes(buf, ref.datatype, ref.shape) for ref, buf in zip(r.inputs, bufs)}
            for r, bufs in zip(requests, buffers)
        ]
        inputs = gather(spec, arrays)
        t1 = time.perf_counter_ns()
        outputs = instance.runner.run(inputs, names)
        t2 = time.perf_counter_ns()
        timings.compute_input_ns, timings.compute_infer_ns = t1 - t0, t2 - t1
        return scatter(spec, outputs, sizes)

    def _respond(self, spec: ModelSpec, version: int, request: InferRequest, piece: dict[str, np.ndarray]) -> InferResponse:
        refs: list[TensorRef] = []
        ttl = max(1.0, (request.deadline_ns - time.time_ns()) / 1e9)
        for name in request.outputs or [o.name for o in spec.outputs]:
            array = piece[name]
            tensor = spec.output(name)
            datatype = protocol_dtype(array.dtype)
            if tensor is not None and tensor.datatype != datatype:
                raise ShoalError(
                    f"unexpected datatype {datatype} for inference output '{name}', expecting {tensor.datatype}",
                    "INTERNAL",
                )
            refs.append(self.store.put(name, datatype, list(array.shape), to_bytes(array, datatype), ttl))
        return InferResponse(request.rid, spec.name, version, refs)


async def run(settings: WorkerSettings, stop: asyncio.Event) -> None:
    nc = await bus.connect(settings.nats_url, f"shoal-worker-{settings.worker_id}")
    await serve_until(stop, nc, WorkerService(settings, nc))
