"""The worker: runs the batches the scheduler sends on the instances it hosts.

Each instance runs on its own thread (native backends release the GIL). After a
batch the worker replies straight to each request's gateway (one message per gateway),
then tells the scheduler the instance is free (with the batch's timings), which is
also the credit for the next batch. Which models it hosts is `host.ModelHost`'s job.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

import msgspec
import numpy as np
from nats.aio.client import Client as NATS

from services.worker.batch import gather, scatter
from services.worker.host import ModelHost
from services.worker.instances import Instance, LoadedModel
from services.worker.python import pb_utils
from services.worker.python.backend import ModelError
from services.worker.python.bls import BlsRuntime
from services.worker.python.callables import InProcessModels
from services.worker.python.decoupled import Cancellations, DecoupledSenders
from services.worker.python.isolation import die_with_parent
from services.worker.replies import Replies
from services.worker.sequences.controls import control_arrays, flags, pad_slots
from shared import bus, discovery, subjects
from shared.datatypes import from_bytes, protocol_dtype, to_bytes
from shared.errors import ShoalError
from shared.logcontext import request_ids
from shared.messages import (
    CancelRequest,
    CreditsRevoked,
    ExecBatch,
    InferRequest,
    InferResponse,
    InstanceFree,
    RequestDone,
    SeqControl,
    SequenceEnded,
    TensorRef,
    WorkerHeartbeat,
    encode,
)
from shared.model_config import ModelSpec
from shared.runtime import serve_until
from shared.settings import WorkerSettings
from shared.tensors import TensorStore, write_region

log = logging.getLogger("shoal.worker")

INLINE_BUDGET = 256 * 1024  # inline output bytes per response: many fit one bus message
_batch_decoder = msgspec.msgpack.Decoder(ExecBatch)
_request_decoder = msgspec.msgpack.Decoder(InferRequest)
_cancel_decoder = msgspec.msgpack.Decoder(CancelRequest)
_ended_decoder = msgspec.msgpack.Decoder(SequenceEnded)


@dataclass
class _Timings:
    compute_input_ns: int = 0
    compute_infer_ns: int = 0


class WorkerService:
    def __init__(self, settings: WorkerSettings, nc: NATS, local: InProcessModels | None = None) -> None:
        self.settings = settings
        self.nc = nc
        # one id per process incarnation: a restarted worker must not inherit the
        # batches its predecessor never finished
        self.id = f"{settings.worker_id}-{uuid.uuid4().hex[:6]}"
        self.subject = subjects.worker_exec(self.id)
        self.store = TensorStore(nc, self.id, settings.inline_max_bytes, settings.tensor_transport)
        self.host = ModelHost(self.id, settings, nc, on_ready=self._grant_idle, on_retired=self._revoke, local=local)
        self._tasks: set[asyncio.Task] = set()
        self._loop = asyncio.get_running_loop()
        self.cancellations = Cancellations()
        self.decoupled = DecoupledSenders(nc, self._stream_piece, self.cancellations)
        self.bls = BlsRuntime(nc, self.store, self.id)
        self._readiness: asyncio.Task | None = None

    async def start(self) -> None:
        await self.store.start()
        await self.bls.start()
        self._spawn(self.decoupled.run())
        await self.nc.subscribe(subjects.SCHEDULER_CANCEL, cb=self._on_cancel)
        await self.nc.subscribe(self.subject, cb=self._on_batch)
        await self.nc.subscribe(subjects.RESYNC, cb=self._on_resync)
        await self.nc.subscribe(subjects.worker_resync(self.id), cb=self._on_resync)
        await self.nc.subscribe(subjects.worker_report(self.id), cb=self._on_report_request)
        await self.nc.subscribe(subjects.worker_sequence(self.id), cb=self._on_sequence_ended)
        await self.host.start()
        self._spawn(self._heartbeat())
        self.micro = await discovery.register(self.nc, "worker", self.id, self.status, shm_host=self.store.host)
        log.info("worker %s started", self.id)

    def status(self) -> dict:
        return {
            "models": {
                f"{m}/{v}": {
                    "generation": loaded.generation,
                    "instances": len(loaded.instances),
                    "busy_instances": sum(1 for i in loaded.instances if i.busy),
                    "instance_list": [
                        {"name": i.name, "kind": i.kind, "device": i.device, "executions": i.executions}
                        for i in loaded.instances
                    ],
                }
                for (m, v), loaded in self.host.models.items()
            },
        }

    async def stop(self) -> None:
        await self.micro.stop()
        for task in list(self._tasks):
            task.cancel()
        await self.host.stop()
        await self.bls.stop()
        await self.store.close()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- credits ----------------------------------------------------------------
    async def _grant_idle(self, loaded: LoadedModel) -> None:
        """Announce every idle credit; first credits of all instances first, so batches spread."""
        if loaded.retired:
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
                        generation=loaded.generation,
                    )
                    await self.nc.publish(subjects.INSTANCE_FREE, encode(free))

    async def _revoke(self, loaded: LoadedModel) -> None:
        revoked = CreditsRevoked(self.id, loaded.spec.name, loaded.version, loaded.generation)
        await self.nc.publish(subjects.CREDITS_REVOKED, encode(revoked))

    async def _on_report_request(self, msg) -> None:
        await self.host.report_all()

    async def _on_sequence_ended(self, msg) -> None:
        """A sequence ended without END (idle timeout, cancelled END): free its implicit state and
        tell a python model that defines the (Shoal-only, optional) `sequence_ended(correlation_id,
        reason)` method, on the instance's own thread so it never overlaps an `execute`."""
        ended = bus.decode(_ended_decoder, msg, log)
        loaded = self.host.models.get((ended.model, ended.version)) if ended is not None else None
        if loaded is None:
            return
        if loaded.states is not None:
            loaded.states.drop(ended.corrid, ended.seq)
        if 0 <= ended.instance < len(loaded.instances):
            instance = loaded.instances[ended.instance]
            hook = getattr(getattr(instance.runner, "model", None), "sequence_ended", None)
            if callable(hook) and not instance.closed:
                try:
                    await self._loop.run_in_executor(instance.executor, hook, ended.corrid, ended.reason)
                except Exception:
                    log.exception("sequence_ended of '%s' failed", ended.model)

    async def _on_resync(self, msg) -> None:
        for loaded in list(self.host.models.values()):
            await self._grant_idle(loaded)

    async def _heartbeat(self) -> None:
        while True:
            instances = {f"{m}/{v}": len(loaded.instances) for (m, v), loaded in self.host.models.items()}
            beat = WorkerHeartbeat(self.id, self.subject, self.store.host, instances, self.settings.heartbeat_s)
            await self.nc.publish(subjects.WORKER_HEARTBEAT, encode(beat))
            families = pb_utils.metrics_snapshot()
            if families:  # python models' custom metrics: every gateway keeps the last of each worker
                await self.nc.publish(
                    subjects.WORKER_METRICS, msgspec.json.encode({"worker": self.id, "families": families})
                )
            self.decoupled.expire()
            if self._readiness is None or self._readiness.done():
                self._readiness = self._spawn(self.host.check_readiness())
            await asyncio.sleep(self.settings.heartbeat_s)

    async def _on_cancel(self, msg) -> None:
        """A client went away: a python model running its request sees `is_cancelled()`."""
        cancel = bus.decode(_cancel_decoder, msg, log)
        if cancel is not None:
            self.cancellations.cancel(cancel.rid)

    # -- batches ----------------------------------------------------------------
    async def _on_batch(self, msg) -> None:
        batch = bus.decode(_batch_decoder, msg, log)
        if batch is None:
            return
        loaded = self.host.models.get((batch.model, batch.version))
        if loaded is None or not loaded.instances:
            await self._fail_batch(
                batch, f"model '{batch.model}' version {batch.version} is not loaded on worker {self.id}"
            )
            return
        if batch.generation != loaded.generation:
            # sent on a credit of a generation retired meanwhile: run it on the current one,
            # outside its credits (the instance's thread still runs one batch at a time)
            instance = loaded.instances[batch.instance % len(loaded.instances)]
            instance.uncredited += 1
            self._spawn(self._execute(loaded, instance, batch, holds_credit=False))
            return
        instance = loaded.instances[batch.instance]
        if batch.credit not in instance.idle:  # a duplicate credit: run it, but it returns no credit
            instance.uncredited += 1
            self._spawn(self._execute(loaded, instance, batch, holds_credit=False))
            return
        instance.idle.discard(batch.credit)
        self._spawn(self._execute(loaded, instance, batch))

    async def _fail_batch(self, batch: ExecBatch, message: str) -> None:
        replies = Replies(batch.reply_via_scheduler)
        for raw in batch.requests:
            request = _request_decoder.decode(raw)
            replies.add(request, InferResponse(request.rid, error=message, code="UNAVAILABLE"))
        # instance -1: not a credit, the scheduler must not send here again
        free = InstanceFree(
            self.id,
            batch.model,
            batch.version,
            -1,
            self.subject,
            credit=batch.credit,
            generation=batch.generation,
            batch_id=batch.batch_id,
        )
        await self._finish(replies, free)

    async def _execute(
        self, loaded: LoadedModel, instance: Instance, batch: ExecBatch, holds_credit: bool = True
    ) -> None:
        free = InstanceFree(
            self.id,
            batch.model,
            batch.version,
            batch.instance,
            self.subject,
            credit=batch.credit,
            generation=batch.generation,
            batch_id=batch.batch_id,
        )
        replies = Replies(batch.reply_via_scheduler)
        requests = [_request_decoder.decode(raw) for raw in batch.requests]
        request_ids.set(",".join(f"{r.id}/{r.rid}" if r.id else r.rid for r in requests))  # this task's log lines
        log.debug(
            "batch %d of '%s' version %d: %d request(s) on instance %d (%s)",
            batch.batch_id,
            batch.model,
            batch.version,
            len(requests),
            instance.index,
            batch.reason,
        )
        try:
            now = time.time_ns()
            live = [r for r in requests if r.deadline_ns > now]
            for request in requests:
                if request.deadline_ns <= now:
                    replies.skip(request)
            if live:
                # the scheduler's enqueue times line up with all of the batch's requests
                enqueued = dict(zip([r.rid for r in requests], batch.enqueued_ns)) if batch.enqueued_ns else {}
                controls = dict(zip([r.rid for r in requests], batch.controls)) if batch.controls else {}
                await self._run_batch(loaded, instance, live, free, replies, batch, enqueued, controls)
        except Exception as exc:  # never lose a request: every one gets an answer
            log.exception("batch %d of '%s' failed", batch.batch_id, batch.model)
            answered = replies.answered()
            code = exc.code if isinstance(exc, ShoalError) else "INTERNAL"
            for request in requests:
                if request.rid not in answered:
                    replies.add(request, InferResponse(request.rid, error=str(exc), code=code))
        finally:
            if loaded.states is not None:  # an END that failed or was skipped still ends the sequence here
                for control in batch.controls:
                    if control.end:
                        loaded.states.drop(control.corrid, control.seq)
            if holds_credit:
                instance.idle.add(batch.credit)
            else:
                instance.uncredited -= 1
            if loaded.retired and not instance.busy:
                instance.close()
            if loaded.retired or not holds_credit:
                free.instance = -1  # tells the scheduler this is not a credit
            await self._finish(replies, free)

    async def _finish(self, replies: Replies, free: InstanceFree) -> None:
        """Send the answers, then the completion; a failure of one must not lose the other."""
        try:
            await replies.send(self.nc, self.nc.max_payload)
        except Exception:
            log.exception("could not send the responses of batch %d", free.batch_id)
        free.done = replies.done
        try:
            await self.nc.publish(subjects.INSTANCE_FREE, encode(free))
        except Exception:  # the scheduler expires the batch and returns the credit itself
            log.exception("could not report batch %d as done", free.batch_id)

    @staticmethod
    def _trace(
        response: InferResponse, request: InferRequest, batch: dict, t0: int, timings: _Timings, t_out: int
    ) -> None:
        response.trace = {
            "COMPUTE_START": t0,
            "COMPUTE_INPUT_END": t0 + timings.compute_input_ns,
            "COMPUTE_OUTPUT_START": t_out,
            "COMPUTE_END": time.monotonic_ns(),
        }
        enqueued = batch["enqueued"].get(request.rid, 0)
        if enqueued:
            response.trace["QUEUE_START"] = enqueued
        response.batch = {k: v for k, v in batch.items() if k != "enqueued"}

    async def _run_batch(
        self,
        loaded: LoadedModel,
        instance: Instance,
        requests: list[InferRequest],
        free: InstanceFree,
        replies: Replies,
        batch: ExecBatch,
        enqueued: dict[str, int],
        controls: dict[str, SeqControl],
    ) -> None:
        spec = loaded.spec
        t0 = time.monotonic_ns()
        arrays, readable = [], []
        for request in requests:  # a request whose inputs cannot be read fails alone, not its batch
            try:
                inputs = await self._inputs(request)
                control = controls.get(request.rid)
                if control is not None:  # sequence models: control tensors and implicit state join the inputs
                    inputs.update(control_arrays(loaded.sequence, control))
                    inputs.update(loaded.states.inputs(control, instance.index))
                arrays.append(inputs)
                readable.append(request)
            except Exception as exc:
                code = "INVALID_ARG" if isinstance(exc, ValueError) else "INTERNAL"
                replies.add(request, InferResponse(request.rid, error=f"cannot read the inputs: {exc}", code=code))
        requests = readable
        if not requests:
            return
        names = sorted(
            {n for r in requests for n in (r.outputs or [o.name for o in spec.outputs])}
            | set(loaded.states.output_names if controls and loaded.states is not None else ())
        )
        sizes = [r.batch_size for r in requests]
        timings = _Timings()
        if hasattr(instance.runner, "run_requests"):  # python models take the requests one by one
            metadata = [self._request_metadata(spec, loaded.version, r, controls.get(r.rid)) for r in requests]
            try:
                pieces = await self._loop.run_in_executor(
                    instance.executor, self._compute_requests, spec, instance, requests, arrays, metadata, timings, t0
                )
            finally:
                for request in requests:
                    if request.rid not in self.decoupled.open:
                        self.cancellations.ended(request.rid)
        elif controls and loaded.sequence.strategy == "direct" and spec.max_batch_size > 0:
            # direct: request i runs in the batch row of its slot; empty slots below are not-ready rows
            rows, where = pad_slots(
                loaded.sequence, [controls[r.rid] for r in requests], arrays, loaded.states.initial()
            )
            pieces = await self._loop.run_in_executor(
                instance.executor, self._compute, spec, instance, rows, names, [1] * len(rows), timings, t0
            )
            pieces = [pieces[row] for row in where]
        else:
            pieces = await self._loop.run_in_executor(
                instance.executor, self._compute, spec, instance, arrays, names, sizes, timings, t0
            )
        free.batch_size = sum(sizes)
        free.compute_input_ns = timings.compute_input_ns
        free.compute_infer_ns = timings.compute_infer_ns
        batch_info = {
            "batch_size": free.batch_size,
            "batch_requests": len(requests),
            "batch_reason": batch.reason,
            "worker": self.id,
            "instance": instance.index,
            "enqueued": enqueued,
        }
        t_out = time.monotonic_ns()
        for request, piece in zip(requests, pieces):
            control = controls.get(request.rid)
            if control is not None and isinstance(piece, dict):
                loaded.states.keep(control, piece)
            if spec.decoupled:  # the model's sender answers; an error ends its stream unless it did already
                if isinstance(piece, ModelError):
                    self.decoupled.fail(request, piece.message, piece.code)
                replies.done.append(RequestDone(rid=request.rid, ok=not isinstance(piece, ModelError)))
                continue
            try:
                if isinstance(piece, ModelError):  # the model answered this request with an error
                    raise ShoalError(piece.message, piece.code)
                response = self._respond(spec, loaded.version, request, piece, batch.reply_via_scheduler)
            except ShoalError as exc:  # this request's problem (e.g. its output region is too small)
                response = InferResponse(request.rid, error=exc.message, code=str(exc.code))
            except Exception as exc:
                response = InferResponse(request.rid, error=f"cannot deliver the outputs: {exc}", code="INTERNAL")
            if request.trace:
                self._trace(response, request, batch_info, t0, timings, t_out)
            replies.add(request, response)
        free.compute_output_ns = time.monotonic_ns() - t_out

    async def _inputs(self, request: InferRequest) -> dict[str, np.ndarray]:
        timeout = max(0.1, (request.deadline_ns - time.time_ns()) / 1e9)
        return {
            ref.name: from_bytes(await self.store.get(ref, timeout), ref.datatype, ref.shape) for ref in request.inputs
        }

    @staticmethod
    def _compute(spec, instance, arrays, names, sizes, timings: _Timings, t0: int):
        inputs = gather(spec, arrays)
        t1 = time.monotonic_ns()
        instance.executions += 1
        outputs = instance.runner.run(inputs, names)
        t2 = time.monotonic_ns()
        timings.compute_input_ns, timings.compute_infer_ns = t1 - t0, t2 - t1
        return scatter(spec, outputs, sizes)

    def _request_metadata(
        self, spec: ModelSpec, version: int, request: InferRequest, control: SeqControl | None
    ) -> dict:
        """What a python model can ask of a request besides its tensors."""
        metadata = _request_metadata(request, control)
        self.cancellations.started(request)
        metadata["cancelled"] = lambda: self.cancellations.is_cancelled(request)
        if spec.decoupled:
            metadata["response_sender"] = self.decoupled.sender(spec, version, request)
        return metadata

    @staticmethod
    def _compute_requests(spec, instance, requests, arrays, metadata, timings: _Timings, t0: int):
        names = [r.outputs or [o.name for o in spec.outputs] for r in requests]
        t1 = time.monotonic_ns()
        instance.executions += 1
        results = instance.runner.run_requests(arrays, names, metadata, min(r.deadline_ns for r in requests))
        timings.compute_input_ns, timings.compute_infer_ns = t1 - t0, time.monotonic_ns() - t1
        return results

    def _stream_piece(self, spec: ModelSpec, version: int, request: InferRequest, piece: dict) -> InferResponse:
        """One response of a decoupled model: the outputs it sent (a stream may send a few)."""
        return self._respond(spec, version, request, piece, small=False, partial=True)

    def _respond(
        self,
        spec: ModelSpec,
        version: int,
        request: InferRequest,
        piece: dict[str, np.ndarray],
        small: bool,
        partial: bool = False,
    ) -> InferResponse:
        """Outputs inline up to a per-response budget (all out of line when the response must
        stay small: it rides in the scheduler's completion message)."""
        ttl = max(1.0, (request.deadline_ns - time.time_ns()) / 1e9)
        budget = 0 if small else INLINE_BUDGET
        outputs = []
        names = request.outputs or [o.name for o in spec.outputs]
        for name in [n for n in names if n in piece] if partial else names:
            array = piece[name]
            tensor = spec.output(name)
            datatype = protocol_dtype(array.dtype)
            if tensor is not None and tensor.datatype != datatype:
                raise ShoalError(
                    f"unexpected datatype {datatype} for inference output '{name}', expecting {tensor.datatype}",
                    "INTERNAL",
                )
            outputs.append((name, datatype, list(array.shape), to_bytes(array, datatype)))
        for name, _, _, payload in outputs:  # every region is checked before any is written
            region = request.output_regions.get(name)
            if region is not None and memoryview(payload).nbytes > region.nbytes:
                raise ShoalError(
                    f"shared memory size specified with the request for output '{name}' ({region.nbytes} bytes) "
                    f"should be at least {memoryview(payload).nbytes} bytes to hold the results",
                    "INTERNAL",
                )
        refs: list[TensorRef] = []
        for name, datatype, shape, payload in outputs:
            region = request.output_regions.get(name)
            if region is not None and write_region(region, payload, self.store.host):
                refs.append(TensorRef(name, datatype, shape, nbytes=memoryview(payload).nbytes, in_region=True))
                continue
            # no region, or one on another host (the gateway writes it)
            nbytes = memoryview(payload).nbytes
            ref = self.store.put(name, datatype, shape, payload, ttl, inline=nbytes <= budget)
            budget -= nbytes if ref.data is not None else 0
            refs.append(ref)
        return InferResponse(request.rid, spec.name, version, refs)


def _request_metadata(request: InferRequest, control: SeqControl | None = None) -> dict:
    """What a python model can ask of a request besides its tensors."""
    params = request.parameters
    custom = {k: v for k, v in params.items() if k not in ("sequence_id", "sequence_start", "sequence_end")}
    if control is None:  # not sequence-batched: the flags as the client sent them, as Triton passes them on
        control = SeqControl(corrid=request.sequence_id, seq=0, start=request.sequence_start, end=request.sequence_end)
    return {
        "request_id": request.id,
        "correlation_id": control.corrid,
        "flags": flags(control),
        "parameters": custom,
        "timeout": request.timeout_us,
    }


async def run(settings: WorkerSettings, stop: asyncio.Event) -> None:
    die_with_parent(settings.parent_pid)
    nc = await bus.connect(settings.nats_url, f"shoal-worker-{settings.worker_id}")
    await serve_until(stop, nc, WorkerService(settings, nc), "worker")
