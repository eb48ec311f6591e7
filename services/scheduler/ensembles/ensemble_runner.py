"""Ensembles run in the scheduler that owns them, as a dataflow over their steps (docs/triton-spec.md §3.5).

An ensemble request seeds a tensor table with its inputs; every step whose mapped inputs
exist is sent at once, as an ordinary `InferRequest`, to the composing model's subject
(`shoal.infer.<member>`), so it goes through that model's own queue and batcher and
batches with everything else sent to it. Steps without a data dependency run in
parallel. Answers come back to this scheduler's inbox (the gateway's `Dispatcher`,
reused: grouped publishes, per-request reply subjects, "no responders", timeouts).

Zero copies: a step's outputs stay where its worker put them (a shared-memory segment, or
held for a bus fetch) and the next step gets the same `TensorRef` under its own input name;
this process never maps, reads or writes them. Small tensors (<= 64 KiB) ride inline in the
messages, as they do everywhere (re-encoding them is cheaper than a segment). Intermediates are
freed when the request ends, whatever the outcome; the ones that are ensemble outputs
are handed to the gateway in the ensemble's response, which frees them after reading,
exactly as it does a worker's response.

A decoupled ensemble (a decoupled step, directly or through a nested ensemble, or its own
transaction policy) answers many times per request: it runs in `ensemble_stream.py`; this
module's dataflow, for every other ensemble, is untouched by it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass, field

import msgspec
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue

from services.scheduler.ensembles.step import fit_batching, resolve_version, step_request
from services.scheduler.ensembles.step_slots import Slots, StepSlots
from services.scheduler.ensembles.stream import EnsembleStream, StreamFailed, finish
from services.scheduler.ensembles.timing import StepLatency, compute_phases
from services.scheduler.statistics.reasons import FailReason
from services.scheduler.statistics.stats import ModelStats
from shared.bus.dispatch import Dispatcher, LocalScheduler
from shared.bus.revisions import CATCH_UP_S, Revisions
from shared.bus.tensor_store import TensorStore
from shared.config.ensemble_graph import (
    EnsembleGraph,
    Step,
    graph_from_config,
    is_decoupled,
    is_ensemble,
    max_inflight,
)
from shared.config.model_config import ModelSpec, spec_from_json
from shared.errors import Code, ShoalError, unavailable
from shared.process.logcontext import request_ids
from shared.tracing import spans
from shared.tracing.spans import Span, Tracing
from shared.wire import subjects
from shared.wire.deadlines import seconds_left
from shared.wire.messages import InferRequest, InferResponse, TensorRef, encode
from shared.wire.records import ModelRecord, ModelState
from shared.wire.statistics import SchedulerStatistics, StepStats

log = logging.getLogger("shoal.scheduler.ensemble")
_request_decoder = msgspec.msgpack.Decoder(InferRequest)


DEADLOCK = "unexpected deadlock, at least one output is not set while no more ensemble steps can be made"


@dataclass
class _Outcome:
    outputs: list[TensorRef]  # under the ensemble's output names
    error: str = ""
    code: str = ""
    handed: list[TensorRef] = field(default_factory=list)  # the step outputs they are: the gateway frees them
    compute: list[int] = field(default_factory=lambda: [0, 0, 0])  # the steps' compute input/infer/output ns


class EnsembleRunner:
    def __init__(self, nc: NATS, scheduler_id: str, local: LocalScheduler | None = None) -> None:
        self.nc = nc
        # never produces tensors: it only frees the intermediates workers produced
        self.store = TensorStore(nc, f"ensemble-{subjects.token(scheduler_id)}")
        # one subject token: a request's reply subject is `<inbox>.<rid>` and rids carry this prefix
        # `local`: this replica; steps of members it holds reach it by a function call, not the bus
        self.dispatcher = Dispatcher(nc, f"ensemble-{subjects.token(scheduler_id)}", self.store, local)
        self.graphs: dict[str, EnsembleGraph] = {}
        self.specs: dict[str, ModelSpec] = {}  # every model's serving spec (steps are checked against it)
        self.ready: dict[str, list[int]] = {}  # model -> its READY versions
        self.running: dict[str, tuple[tuple[str, int], asyncio.Task[None]]] = {}  # rid -> (ensemble key, task)
        self.steps: dict[tuple[str, int], dict[str, StepLatency]] = {}  # ensemble key -> step model -> latency
        self.decoupled: set[str] = set()  # ensembles that stream (a decoupled step, or their own policy)
        self.slots = StepSlots()  # `max_inflight_requests`: each step's limit, shared by the ensemble's requests
        self.revisions = Revisions()  # how far the records above have come (the scheduler's watch)
        self.models_kv: KeyValue | None = None

    async def start(self, models_kv: KeyValue) -> None:
        self.models_kv = models_kv
        await self.dispatcher.start()

    # -- what the scheduler tells us --------------------------------------------------------
    def on_record(self, name: str, record: ModelRecord | None, revision: int) -> None:
        """Every model's record: ensembles to run, and the members' specs and READY versions."""
        self._apply(name, record)
        self.revisions.advance(revision)

    def _apply(self, name: str, record: ModelRecord | None) -> None:
        config = record.active_config if record is not None else {}
        if record is None or not config:
            self.specs.pop(name, None)
            self.ready.pop(name, None)
            self.graphs.pop(name, None)
            self.slots.forget(name)
            self._derive_decoupled()
            return
        self.specs[name] = spec_from_json(config, name)
        self.ready[name] = sorted(int(v) for v, s in record.versions.items() if s.state == ModelState.READY)
        if is_ensemble(config):
            self.graphs[name] = graph_from_config(config)
        else:
            self.graphs.pop(name, None)
        self._derive_decoupled()

    def _derive_decoupled(self) -> None:
        """Any record can change whether an ensemble streams (a member reloaded decoupled): redo all."""
        configs = {model: spec.config for model, spec in self.specs.items()}
        self.decoupled = {model for model in self.graphs if is_decoupled(model, configs)}

    def _servable(self, model: str) -> bool:
        """Whether this view has the ensemble and a READY version of every member it calls."""
        graph = self.graphs.get(model)
        if graph is None or any(step.model not in self.specs for step in graph.steps):
            return False
        try:  # the steps' own resolution (step.py), not a second copy of its rule
            for step in graph.steps:
                resolve_version(step.model, step.version, self.ready)
        except ShoalError:
            return False
        return True

    async def _catch_up(self, model: str) -> None:
        """The gateway sent this request because its view has the ensemble and its members READY;
        this view comes from another watch of the same bucket and may be a revision or two behind
        (a member loaded a moment ago). Before failing a step on an older view, wait (briefly)
        for this one to reach the bucket's newest revision. Costs nothing when nothing lags."""
        if self._servable(model) or self.models_kv is None:
            return
        await self.revisions.catch_up(self.models_kv, CATCH_UP_S)  # else the step fails on this view

    def handles(self, model: str) -> bool:
        return model in self.graphs

    def busy(self, key: tuple[str, int]) -> bool:
        return any(k == key for k, _ in self.running.values())

    def submit(self, raw: msgspec.Raw, stats: ModelStats) -> None:
        arrived = time.monotonic_ns()
        try:
            request = _request_decoder.decode(raw)
        except msgspec.DecodeError as exc:
            log.error("undecodable ensemble request: %s", exc)
            return
        key = (request.model, request.version)
        task = asyncio.create_task(self._serve(request, stats, arrived))
        self.running[request.rid] = (key, task)
        task.add_done_callback(functools.partial(self._ended, request.rid))

    def _ended(self, rid: str, _task: asyncio.Task[None]) -> None:
        self.running.pop(rid, None)

    def cancel(self, rid: str) -> bool:
        """The client went away: stop the request (its in-flight steps are cancelled too)."""
        entry = self.running.get(rid)
        if entry is None:
            return False
        entry[1].cancel()
        return True

    def annotate(self, reply: SchedulerStatistics) -> None:
        """Per-step latency in an ensemble's statistics (`ensemble_steps`: member -> success/fail
        count and ns), next to Triton's fields: where an ensemble's time goes."""
        for (model, version), steps in self.steps.items():
            entry = reply.versions.get(f"{model}/{version}")
            if entry is not None and steps:
                entry.stats.ensemble_steps = {
                    member: StepStats(s.success.snapshot(), s.fail.snapshot()) for member, s in steps.items()
                }

    # -- one request ---------------------------------------------------------------------------
    async def _serve(self, request: InferRequest, stats: ModelStats, arrived: int) -> None:
        await self._catch_up(request.model)
        run = self._run_stream if request.model in self.decoupled else self._run
        await run(request, stats, arrived)

    async def _run(self, request: InferRequest, stats: ModelStats, arrived: int) -> None:
        started = time.monotonic_ns()
        request_ids.set(f"{request.id}/{request.rid}" if request.id else request.rid)
        owned: list[TensorRef] = []  # every step output: freed at the end unless handed to the gateway
        handed: set[int] = set()
        outcome = _Outcome([], "request was cancelled", Code.CANCELLED)
        try:
            outcome = await self._execute(request, owned)
            handed = {id(ref) for ref in outcome.handed}
        except asyncio.CancelledError:
            stats.record_request(False, time.time_ns() - request.received_ns, FailReason.CANCELED)
            raise
        except Exception as exc:  # never leave the client without an answer
            log.exception("ensemble '%s' failed", request.model)
            outcome = _Outcome([], f"in ensemble '{request.model}', {type(exc).__name__}: {exc}", Code.INTERNAL)
        finally:
            leftovers = [ref for ref in owned if id(ref) not in handed]
            if leftovers:
                await self.store.release_remote(leftovers)
        duration = time.time_ns() - request.received_ns
        if outcome.error:
            record_failure(stats, duration)
            response = InferResponse(rid=request.rid, error=outcome.error, code=str(outcome.code))
        else:
            # as Triton counts an ensemble: one execution of the request's batch size, whose
            # compute times are the sums of its steps'
            stats.record_queue(started - arrived)
            stats.record_request(True, duration)
            stats.record_batch(max(1, request.batch_size), 1, *outcome.compute)
            response = InferResponse(
                rid=request.rid, model=request.model, version=request.version, outputs=outcome.outputs
            )
            if request.trace:  # a traced request, or a step of an outer ensemble that sums compute times
                end = time.monotonic_ns()
                response.trace = {
                    "QUEUE_START": arrived,
                    "COMPUTE_START": started,
                    "COMPUTE_INPUT_END": started + outcome.compute[0],
                    "COMPUTE_OUTPUT_START": end - outcome.compute[2],
                    "COMPUTE_END": end,
                }
        try:
            await self.nc.publish(request.reply, encode(response))
        except Exception:  # the gateway times out; the outputs expire with the request's deadline
            log.exception("cannot answer ensemble request %s", request.rid)

    async def _run_stream(self, request: InferRequest, stats: ModelStats, arrived: int) -> None:
        """A decoupled ensemble: responses as its iterations complete, then the final flag."""
        started = time.monotonic_ns()
        request_ids.set(f"{request.id}/{request.rid}" if request.id else request.rid)
        graph = self.graphs[request.model]
        error: StreamFailed | None = None
        stream = EnsembleStream(self, request, graph)
        try:
            compute = await stream.run()
        except asyncio.CancelledError:
            stats.record_request(False, time.time_ns() - request.received_ns, FailReason.CANCELED)
            raise
        except StreamFailed as exc:
            error = exc
        except Exception as exc:  # never leave the client's stream open
            log.exception("ensemble '%s' failed", request.model)
            error = StreamFailed(f"{type(exc).__name__}: {exc}", Code.INTERNAL)
        duration = time.time_ns() - request.received_ns
        # its first response went out mid-stream, or it is the last (with the final flag, or the error)
        first = stream.first_ns - request.received_ns if stream.first_ns else None
        if error is not None:
            record_failure(stats, duration, first)
        else:
            stats.record_queue(started - arrived)
            stats.record_request(True, duration, first_response_ns=first)
            stats.record_batch(max(1, request.batch_size), 1, *compute)
        await finish(self, request, error, stream.last)

    async def _execute(self, request: InferRequest, owned: list[TensorRef]) -> _Outcome:
        graph = self.graphs.get(request.model)
        if graph is None:
            return _Outcome([], f"Request for unknown model: '{request.model}' is not found", Code.NOT_FOUND)
        requested = list(request.outputs) or list(graph.outputs)
        steps = graph.needed_steps(requested)
        readers = graph.consumers(steps)
        # None: known to be absent (Triton's empty placeholder), an optional ensemble input the
        # request left out or an output a step did not produce; the steps that read it run without it
        tensors: dict[str, TensorRef | None] = {ref.name: ref for ref in request.inputs}
        spec = self.specs.get(request.model)
        for tensor in spec.inputs if spec is not None else ():
            if tensor.optional and tensor.name not in tensors:
                tensors[tensor.name] = None
        # whether each tensor carries a batch dimension (it came from a model with max_batch_size > 0)
        batched = {name: bool(spec and spec.max_batch_size > 0) for name in tensors}
        pending = list(steps)
        running: dict[asyncio.Task[InferResponse], tuple[Step, float]] = {}
        traced: dict[asyncio.Task[InferResponse], Span] = {}  # opentelemetry: each running step's span
        error: tuple[str, str] | None = None
        compute = [0, 0, 0]
        latencies = self.steps.setdefault((request.model, request.version), {})
        limit = max_inflight(spec.config) if spec is not None else 0
        try:
            while True:
                if error is None:  # after a failure nothing new starts; what runs drains
                    for step in [s for s in pending if all(t in tensors for t in s.input_map.values())]:
                        pending.remove(step)
                        try:
                            sub = step_request(
                                request,
                                step,
                                tensors,
                                batched,
                                requested,
                                readers,
                                self.specs,
                                self.ready,
                                self.dispatcher,
                            )
                        except ShoalError as exc:
                            error = (exc.message, str(exc.code))
                            break
                        span = step_span(spans.active, request, sub) if request.traceparent and spans.active else None
                        if limit:
                            slots = self.slots.for_step((request.model, request.version), limit, step.index)
                            task = asyncio.create_task(self._gated(slots, sub))
                        else:
                            task = asyncio.create_task(self.call(sub))
                        running[task] = (step, time.monotonic())
                        if span is not None:
                            traced[task] = span
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step, started = running.pop(task)
                    response = task.result()
                    if task in traced:
                        step_done(traced.pop(task), response.error)
                    owned.extend(response.outputs)
                    latency = latencies.setdefault(step.model, StepLatency())
                    (latency.fail if response.error else latency.success).add(int((time.monotonic() - started) * 1e9))
                    if response.error:
                        error = error or (response.error, response.code or Code.INTERNAL)
                    else:
                        self._absorb(step, response, tensors, batched, compute)
        finally:
            for span in traced.values():
                step_done(span, "cancelled")
            for task in running:  # cancelled: the steps' requests leave their queues too
                if task.done() and not task.cancelled():
                    owned.extend(task.result().outputs)  # answered just now: free its outputs too
                else:
                    task.cancel()
        if error is not None:
            return _Outcome([], f"in ensemble '{request.model}', {error[0]}", error[1])
        if any(name not in tensors for name in requested):
            return _Outcome([], f"in ensemble '{request.model}', {DEADLOCK}", Code.INVALID_ARG)
        # the ensemble's outputs under the ensemble's names; the handles are the workers' own
        present = [(name, ref) for name in requested if (ref := tensors[name]) is not None]
        handed = [ref for _, ref in present]
        outputs = [_renamed(spec, name, ref, batched[name]) for name, ref in present]
        return _Outcome(outputs, handed=handed, compute=compute)

    def _absorb(
        self,
        step: Step,
        response: InferResponse,
        tensors: dict[str, TensorRef | None],
        batched: dict[str, bool],
        compute: list[int],
    ) -> None:
        """A step's outputs join the tensor table; its compute times add to the ensemble's."""
        for i, ns in enumerate(compute_phases(response.trace)):
            compute[i] += ns
        member = self.specs.get(step.model)
        for ref in response.outputs:
            tensor = step.output_map.get(ref.name)
            if tensor is not None:
                tensors[tensor] = ref
                batched[tensor] = bool(member and member.max_batch_size > 0)
        for tensor in step.output_map.values():  # not produced: absent for the steps that read it
            tensors.setdefault(tensor, None)

    async def _gated(self, slots: Slots, request: InferRequest) -> InferResponse:
        """A step request sent once its step has a free slot (`max_inflight_requests`), within its
        deadline; the slot is given back when the answer comes (or the request is cancelled)."""
        try:
            async with asyncio.timeout(seconds_left(request.deadline_ns, 0.001)):
                await slots.acquire()
        except TimeoutError:
            exc = unavailable("Request timeout expired")
            return InferResponse(rid=request.rid, error=exc.message, code=str(exc.code))
        try:
            return await self.call(request)
        finally:
            slots.give_back()

    async def call(self, request: InferRequest) -> InferResponse:
        """One step request to its member, answered (an error as a response, never raised)."""
        timeout = seconds_left(request.deadline_ns, 0.001)
        try:
            return await self.dispatcher.infer(request, timeout)
        except ShoalError as exc:
            return InferResponse(rid=request.rid, error=exc.message, code=str(exc.code))


def _renamed(spec: ModelSpec | None, name: str, ref: TensorRef, batched: bool) -> TensorRef:
    """A step's output as the ensemble's output `name`, its shape fitted to the ensemble's batching."""
    config = spec.output(name) if spec is not None else None
    shape = (
        fit_batching(config.dims, spec.max_batch_size > 0, ref.shape, batched)
        if config is not None and spec is not None
        else ref.shape
    )
    return msgspec.structs.replace(ref, name=name, shape=shape)


def step_span(tracing: Tracing, request: InferRequest, sub: InferRequest) -> Span:
    """A traced ensemble's step: the member's model span under the ensemble's (Triton's shape),
    begun now and named for the member; the step request carries it, so the member's queue and
    compute spans hang under it wherever they run."""
    now = time.monotonic_ns()
    attributes: dict[str, str | int] = {"triton.model_name": sub.model, "triton.model_version": sub.version}
    if sub.id:
        attributes["triton.request_id"] = sub.id
    span = tracing.start(sub.model, (request.traceparent, request.tracestate), now, attributes)
    tracing.event(span, "REQUEST_START", now)
    sub.traceparent, sub.tracestate = tracing.carrier(span)
    tracing.event(span, "QUEUE_START", time.monotonic_ns())
    return span


def step_done(span: Span, error: str) -> None:
    now = time.monotonic_ns()
    Tracing.event(span, "REQUEST_END", now)
    Tracing.end(span, now, error)


def record_failure(stats: ModelStats, duration_ns: int, first_response_ns: int | None = None) -> None:
    """A failed ensemble request counts twice, reason OTHER, as in Triton's core: the ensemble
    answers the error (`RespondIfError`: one failure) and then reports the request's statistics
    unsuccessful (`ReportStatisticsWithDuration`: another). qa/L0_model_queue `test_policy_reject`
    expects 4 in `nv_inference_request_failure{reason="OTHER"}` for 2 failed ensemble requests
    (issue 28 item 12)."""
    stats.record_request(False, duration_ns, FailReason.OTHER, first_response_ns=first_response_ns)
    stats.record_request(False, duration_ns, FailReason.OTHER, responded=False)  # one response, two reports
