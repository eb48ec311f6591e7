"""One batch on one instance: read the inputs, compute on the instance's thread, respond.

Every request of a batch gets an answer whatever fails: a request whose inputs cannot be read
fails alone, an error of the model fails the requests it names, anything else fails the rest
of the batch. Then the instance's credit goes back to the scheduler with the batch's timings.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from services.worker.backends.runner import Batch, ModelError, RequestContext, Rescheduled, Result, Tensors, Work
from services.worker.completions import Completions
from services.worker.instances import Instance, LoadedModel
from services.worker.outputs import Outputs
from services.worker.replies import Replies
from services.worker.sequences.controls import control_arrays, flags, pad_slots
from services.worker.streams import Cancellations, DecoupledSenders
from shared.bus import eager, hot_path
from shared.bus.hot_path import Outgoing
from shared.bus.tensor_store import TensorStore
from shared.config.datatypes import from_bytes
from shared.errors import Code, ShoalError
from shared.process.logcontext import request_ids
from shared.tracing import spans
from shared.wire import subjects
from shared.wire.messages import ExecBatch, InferRequest, InferResponse, InstanceFree, RequestDone, SeqControl

log = logging.getLogger("shoal.worker")
_request_decoder = msgspec.msgpack.Decoder(InferRequest)
_DELIVERY_FIELDS = ("batch_size", "batch_requests", "batch_reason", "worker", "instance")


@dataclass
class _Run:
    """A batch's requests that could be read, what the model made of them and when."""

    requests: list[InferRequest]
    results: list[Result]
    started_ns: int  # monotonic: reading the inputs began
    inputs_ns: int  # inputs read and in the runner's form
    computed_ns: int


class BatchExecutor:
    def __init__(
        self,
        worker_id: str,
        nc: NATS,
        store: TensorStore,
        outputs: Outputs,
        cancellations: Cancellations,
        decoupled: DecoupledSenders,
        completions: Completions,
    ) -> None:
        self.worker_id = worker_id
        self.completions = completions
        self.nc = nc
        self.store = store
        self.outputs = outputs
        self.cancellations = cancellations
        self.decoupled = decoupled
        self.loop = asyncio.get_running_loop()
        self.subject = subjects.worker_exec(worker_id)
        self.holding: set[int] = set()  # batch ids received and not finished (WorkerHoldings)

    def _free(self, batch: ExecBatch, instance: int) -> InstanceFree:
        return InstanceFree(
            self.worker_id,
            batch.model,
            batch.version,
            instance,
            self.subject,
            credit=batch.credit,
            generation=batch.generation,
            batch_id=batch.batch_id,
        )

    async def fail(self, batch: ExecBatch, message: str) -> None:
        """A batch this worker cannot run (its model is not loaded here)."""
        replies = Replies(batch.reply_via_scheduler)
        for raw in batch.requests:
            request = _request_decoder.decode(raw)
            replies.add(request, InferResponse(request.rid, error=message, code="UNAVAILABLE"))
        # instance -1: not a credit, the scheduler must not send here again
        await self._finish(replies, self._free(batch, -1), batch.complete_to)

    def start(
        self, loaded: LoadedModel, instance: Instance, batch: ExecBatch, holds_credit: bool
    ) -> Coroutine[Any, Any, None] | None:
        """Run a batch; returns the coroutine to run as a Task when it must wait on the loop before
        the model runs (inputs to fetch, sequence controls), else None.

        The common case (inline inputs, no sequence) needs no Task: the inputs are read here, the
        instance's thread runs the model and calls `_computed` back on the loop, which responds.
        That saves, per batch, a Task, its first step and its wake-up (a loop iteration each)."""
        self.holding.add(batch.batch_id)
        requests = [_request_decoder.decode(raw) for raw in batch.requests]
        if batch.controls or any(ref.data is None for r in requests for ref in r.inputs):
            return self.execute(loaded, instance, batch, holds_credit, requests)
        free = self._free(batch, batch.instance)
        replies = Replies(batch.reply_via_scheduler)
        self._label(batch, instance, requests)
        try:
            live = self._live(requests, replies)
            started = time.monotonic_ns()
            readable = []
            for request in live:
                inputs = self._inline_inputs(request, replies)
                if inputs is not None:
                    readable.append((request, inputs))
            if readable:
                run = self._batch(loaded, readable, {})
                ran = [r for r, _ in readable]
                enqueued = _enqueued(batch, requests)
                context = contextvars.copy_context()  # this batch's log lines, on the loop again
                done = partial(
                    self._computed, loaded, instance, batch, holds_credit, free, replies, ran, enqueued, run, started
                )
                instance.executor.call(_execute, (instance, run), lambda r, e: context.run(done, r, e), self.loop)
                return None
        except Exception as exc:  # never lose a request: every one gets an answer
            self._ended(requests)
            self._failed(batch, requests, replies, exc)
        self._settle(loaded, instance, batch, holds_credit, free)
        self._finish_now(replies, free, batch.complete_to)
        return None

    def _computed(
        self,
        loaded: LoadedModel,
        instance: Instance,
        batch: ExecBatch,
        holds_credit: bool,
        free: InstanceFree,
        replies: Replies,
        requests: list[InferRequest],
        enqueued: dict[str, int],
        run: Batch,
        started: int,
        results: list[Result] | None,
        error: BaseException | None,
    ) -> None:
        """Back on the loop after `start` handed the batch to the instance's thread."""
        try:
            self._ended(requests)
            if error is not None:
                raise error
            assert results is not None
            computed = time.monotonic_ns()
            done = _Run(requests, results, started, run.inputs_done_ns or started, computed)
            self._respond(loaded, instance, done, free, replies, batch, {}, enqueued)
        except Exception as exc:
            self._failed(batch, requests, replies, exc)
        finally:
            self._settle(loaded, instance, batch, holds_credit, free)
            self._finish_now(replies, free, batch.complete_to)

    async def execute(
        self,
        loaded: LoadedModel,
        instance: Instance,
        batch: ExecBatch,
        holds_credit: bool,
        requests: list[InferRequest] | None = None,
    ) -> None:
        free = self._free(batch, batch.instance)
        replies = Replies(batch.reply_via_scheduler)
        if requests is None:
            requests = [_request_decoder.decode(raw) for raw in batch.requests]
        self._label(batch, instance, requests)
        try:
            live = self._live(requests, replies)
            if live:
                # the scheduler's per-request lists line up with all of the batch's requests
                controls = dict(zip([r.rid for r in requests], batch.controls)) if batch.controls else {}
                await self._run(loaded, instance, live, free, replies, batch, controls, _enqueued(batch, requests))
        except Exception as exc:  # never lose a request: every one gets an answer
            self._failed(batch, requests, replies, exc)
        finally:
            self._settle(loaded, instance, batch, holds_credit, free)
            await self._finish(replies, free, batch.complete_to)

    @staticmethod
    def _label(batch: ExecBatch, instance: Instance, requests: list[InferRequest]) -> None:
        request_ids.set(",".join([f"{r.id}/{r.rid}" if r.id else r.rid for r in requests]))  # this batch's log lines
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "batch %d of '%s' version %d: %d request(s) on instance %d (%s)",
                batch.batch_id,
                batch.model,
                batch.version,
                len(requests),
                instance.index,
                batch.reason,
            )

    @staticmethod
    def _live(requests: list[InferRequest], replies: Replies) -> list[InferRequest]:
        """The requests someone still waits for; the others are answered as skipped."""
        now = time.time_ns()
        live = []
        for request in requests:
            if request.deadline_ns > now:
                live.append(request)
            else:
                replies.skip(request)
        return live

    @staticmethod
    def _failed(batch: ExecBatch, requests: list[InferRequest], replies: Replies, exc: BaseException) -> None:
        """The batch failed: every request not answered yet gets the error."""
        log.error("batch %d of '%s' failed", batch.batch_id, batch.model, exc_info=exc)
        answered = replies.answered()
        code = exc.code if isinstance(exc, ShoalError) else Code.INTERNAL
        for request in requests:
            if request.rid not in answered:
                replies.add(request, InferResponse(request.rid, error=str(exc), code=str(code)))

    @staticmethod
    def _settle(
        loaded: LoadedModel, instance: Instance, batch: ExecBatch, holds_credit: bool, free: InstanceFree
    ) -> None:
        """The batch is over on this instance: its credit comes back (or the instance closes)."""
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

    async def _finish(self, replies: Replies, free: InstanceFree, complete_to: str) -> None:
        self.holding.discard(free.batch_id)
        await self._send(*self._messages(replies, free, complete_to), free.batch_id)

    def _finish_now(self, replies: Replies, free: InstanceFree, complete_to: str) -> None:
        """`_finish` from a callback: written at once in the common case, else by a coroutine."""
        self.holding.discard(free.batch_id)
        messages, completion = self._messages(replies, free, complete_to)
        with contextlib.suppress(Exception):  # `_send` tries again and reports
            if hot_path.publish_now(self.nc, [*messages, completion]):
                return
        eager.start(self._send(messages, completion, free.batch_id))

    async def _send(self, messages: list[Outgoing], completion: Outgoing, batch_id: int) -> None:
        """The answers, then the completion, in one write; a failure of the answers must not lose
        the completion."""
        try:
            if not hot_path.publish_now(self.nc, [*messages, completion]):
                await hot_path.publish_all(self.nc, [*messages, completion])
            return
        except Exception:  # both send all of the messages or none
            if messages:
                log.exception("could not send the responses of batch %d", batch_id)
        try:
            await hot_path.publish_all(self.nc, [completion])
        except Exception:  # the scheduler expires the batch and returns the credit itself
            log.exception("could not report batch %d as done", batch_id)

    def _messages(self, replies: Replies, free: InstanceFree, complete_to: str) -> tuple[list[Outgoing], Outgoing]:
        """The answers for each gateway, and the completion: for a co-hosted scheduler
        (`complete_to`), its gateway's answers travel with the completion."""
        together = replies.take(subjects.inbox_of(complete_to)) if complete_to else []
        try:
            messages = replies.messages(self.nc.max_payload)
        except Exception:
            log.exception("could not encode the responses of batch %d", free.batch_id)
            messages = []
        free.done = replies.done
        if complete_to:
            return messages, self.completions.done_message(complete_to, free, together)
        return messages, self.completions.free_message(free)

    async def _run(
        self,
        loaded: LoadedModel,
        instance: Instance,
        requests: list[InferRequest],
        free: InstanceFree,
        replies: Replies,
        batch: ExecBatch,
        controls: dict[str, SeqControl],
        enqueued: dict[str, int],
    ) -> None:
        started = time.monotonic_ns()
        readable = await self._read(loaded, instance, requests, controls, replies)
        if readable:
            run = await self._compute(loaded, instance, readable, controls, started)
            self._respond(loaded, instance, run, free, replies, batch, controls, enqueued)

    # -- read ---------------------------------------------------------------------------
    async def _read(
        self,
        loaded: LoadedModel,
        instance: Instance,
        requests: list[InferRequest],
        controls: dict[str, SeqControl],
        replies: Replies,
    ) -> list[tuple[InferRequest, Tensors]]:
        """Each request's input tensors; a request whose inputs cannot be read fails alone."""
        readable = []
        for request in requests:
            try:
                inputs = await self._inputs(request)
                control = controls.get(request.rid)
                if control is not None:  # sequence models: control tensors and implicit state join the inputs
                    if loaded.sequence is not None:
                        inputs.update(control_arrays(loaded.sequence, control))
                    if loaded.states is not None:
                        inputs.update(loaded.states.inputs(control, instance.index))
                readable.append((request, inputs))
            except Exception as exc:
                replies.add(request, _unreadable(request, exc))
        return readable

    async def _inputs(self, request: InferRequest) -> Tensors:
        timeout = max(0.1, (request.deadline_ns - time.time_ns()) / 1e9)
        return {
            ref.name: from_bytes(await self.store.get(ref, timeout), ref.datatype, ref.shape) for ref in request.inputs
        }

    @staticmethod
    def _inline_inputs(request: InferRequest, replies: Replies) -> Tensors | None:
        """`_read` for a request whose tensors all came inline (nothing to wait for); None when
        they cannot be read (the request is answered with the error)."""
        try:
            return {ref.name: from_bytes(ref.data, ref.datatype, ref.shape) for ref in request.inputs}  # type: ignore[arg-type]
        except Exception as exc:
            replies.add(request, _unreadable(request, exc))
            return None

    # -- compute ------------------------------------------------------------------------
    def _batch(
        self, loaded: LoadedModel, readable: list[tuple[InferRequest, Tensors]], controls: dict[str, SeqControl]
    ) -> Batch:
        """The runner's batch: one `Work` per request."""
        every = [o.name for o in loaded.spec.outputs]
        work = [
            Work(inputs, r.outputs or every, r.batch_size, self._context(loaded, r, controls.get(r.rid)))
            for r, inputs in readable
        ]
        state_outputs = loaded.states.output_names if controls and loaded.states is not None else []
        return Batch(work, min(r.deadline_ns for r, _ in readable), list(state_outputs))

    def _ended(self, requests: list[InferRequest]) -> None:
        """The model returned: requests it does not stream any more can no longer be cancelled."""
        for request in requests:
            if request.rid not in self.decoupled.open:
                self.cancellations.ended(request.rid)

    async def _compute(
        self,
        loaded: LoadedModel,
        instance: Instance,
        readable: list[tuple[InferRequest, Tensors]],
        controls: dict[str, SeqControl],
        started: int,
    ) -> _Run:
        requests = [request for request, _ in readable]
        batch = self._batch(loaded, readable, controls)
        work = batch.work
        sequence = loaded.sequence
        try:
            if controls and sequence is not None and loaded.states is not None and _direct(loaded, instance):
                # direct: request i runs in the batch row of its slot; empty slots below are not-ready rows
                rows, where = pad_slots(
                    sequence, [controls[r.rid] for r in requests], [w.inputs for w in work], loaded.states.initial()
                )
                names = sorted({n for w in work for n in w.outputs})
                padded = Batch([Work(row, names) for row in rows], batch.deadline_ns, batch.extra_outputs)
                results = await instance.executor.run(_execute, instance, padded)
                results, batch.inputs_done_ns = [results[row] for row in where], padded.inputs_done_ns
            else:
                results = await instance.executor.run(_execute, instance, batch)
        finally:
            self._ended(requests)
        computed = time.monotonic_ns()
        return _Run(requests, results, started, batch.inputs_done_ns or started, computed)

    def _context(self, loaded: LoadedModel, request: InferRequest, control: SeqControl | None) -> RequestContext:
        """What a model can ask of a request besides its tensors."""
        params = request.parameters
        custom = {k: v for k, v in params.items() if k not in ("sequence_id", "sequence_start", "sequence_end")}
        if control is None:  # not sequence-batched: the flags as the client sent them, as Triton passes them on
            control = SeqControl(
                corrid=request.sequence_id, seq=0, start=request.sequence_start, end=request.sequence_end
            )
        self.cancellations.started(request)
        spec = loaded.spec
        return RequestContext(
            request_id=request.id,
            correlation_id=control.corrid,
            flags=flags(control),
            parameters=custom,
            timeout_us=request.timeout_us,
            cancelled=lambda: self.cancellations.is_cancelled(request),
            responses=self.decoupled.stream(spec, loaded.version, request) if spec.decoupled else None,
            trace=(request.traceparent, request.tracestate) if request.traceparent else None,
        )

    # -- respond ------------------------------------------------------------------------
    def _respond(
        self,
        loaded: LoadedModel,
        instance: Instance,
        run: _Run,
        free: InstanceFree,
        replies: Replies,
        batch: ExecBatch,
        controls: dict[str, SeqControl],
        enqueued: dict[str, int],
    ) -> None:
        spec = loaded.spec
        free.batch_size = sum(r.batch_size for r in run.requests)
        free.compute_input_ns = run.inputs_ns - run.started_ns
        free.compute_infer_ns = run.computed_ns - run.inputs_ns
        delivery = (free.batch_size, len(run.requests), batch.reason, self.worker_id, instance.index)
        t_out = time.monotonic_ns()
        for request, result in zip(run.requests, run.results):
            control = controls.get(request.rid)
            if control is not None and loaded.states is not None and isinstance(result, dict):
                loaded.states.keep(control, result)
            if isinstance(result, Rescheduled):  # no answer now: the scheduler queues it again
                replies.done.append(RequestDone(rid=request.rid, ok=True, rescheduled=True))
                continue
            if spec.decoupled:  # the model's stream answers; an error ends it unless it did already
                if isinstance(result, ModelError):
                    self.decoupled.fail(request, result.message, result.code)
                replies.done.append(RequestDone(rid=request.rid, ok=not isinstance(result, ModelError)))
                continue
            response = self._response(loaded, request, result, batch.reply_via_scheduler)
            if request.trace:
                response.trace = {
                    "COMPUTE_START": run.started_ns,
                    "COMPUTE_INPUT_END": run.inputs_ns,
                    "COMPUTE_OUTPUT_START": t_out,
                    "COMPUTE_END": time.monotonic_ns(),
                }
                if enqueued.get(request.rid):
                    response.trace["QUEUE_START"] = enqueued[request.rid]
                response.batch = dict(zip(_DELIVERY_FIELDS, delivery))
            replies.add(request, response)
        computed = time.monotonic_ns()
        free.compute_output_ns = computed - t_out
        if spans.active is not None:  # opentelemetry mode (one comparison when off)
            times = (run.started_ns, run.inputs_ns, t_out, computed)
            compute_spans(spans.active, run.requests, times, (*delivery, batch.batch_id))

    def _response(self, loaded: LoadedModel, request: InferRequest, result: Result, small: bool) -> InferResponse:
        try:
            if isinstance(result, ModelError):  # the model answered this request with an error
                raise ShoalError(result.message, result.code)
            if not isinstance(result, dict):
                raise ShoalError("the model streamed the responses of a model that is not decoupled", Code.INTERNAL)
            return self.outputs.response(loaded.spec, loaded.version, request, result, small)
        except ShoalError as exc:  # this request's problem (e.g. its output region is too small)
            return InferResponse(request.rid, error=exc.message, code=str(exc.code))
        except Exception as exc:
            return InferResponse(request.rid, error=f"cannot deliver the outputs: {exc}", code="INTERNAL")


def compute_spans(
    tracing: spans.Tracing, requests: list[InferRequest], times: tuple[int, int, int, int], delivery: tuple
) -> None:
    """Triton's `compute` span of each traced request (under its model span, whose context the
    request carries): COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START and COMPUTE_END,
    and where it ran. The batch's requests share the times: they ran together."""
    attributes = dict(zip(_COMPUTE_ATTRIBUTES, delivery))
    for request in requests:
        if request.traceparent:
            span = tracing.start("compute", (request.traceparent, request.tracestate), times[0], attributes)
            for name, ns in zip(_COMPUTE_EVENTS, times):
                tracing.event(span, name, ns)
            tracing.end(span, times[3])


_COMPUTE_ATTRIBUTES = (
    "shoal.batch.size",
    "shoal.batch.requests",
    "shoal.batch.reason",
    "shoal.worker",
    "shoal.instance",
    "shoal.batch.id",
)
_COMPUTE_EVENTS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


def _unreadable(request: InferRequest, exc: Exception) -> InferResponse:
    code = "INVALID_ARG" if isinstance(exc, ValueError) else "INTERNAL"
    return InferResponse(request.rid, error=f"cannot read the inputs: {exc}", code=code)


def _enqueued(batch: ExecBatch, requests: list[InferRequest]) -> dict[str, int]:
    """When each request was queued (for its trace), when the scheduler says."""
    return dict(zip([r.rid for r in requests], batch.enqueued_ns)) if batch.enqueued_ns else {}


def _direct(loaded: LoadedModel, instance: Instance) -> bool:
    sequence = loaded.sequence
    return (
        sequence is not None
        and sequence.strategy == "direct"
        and loaded.spec.max_batch_size > 0
        and instance.runner.batches_rows
    )


def _execute(instance: Instance, batch: Batch) -> list[Result]:
    instance.executions += 1
    return instance.runner.execute(batch)
