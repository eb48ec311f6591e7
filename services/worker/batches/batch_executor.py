"""A worker's batches: each one from its arrival to its last response, on one path.

A batch (`batch_run.BatchRun`) arrives; its requests' inputs are read (fetched first, on the loop,
when they are not all inline); the instance's thread runs the model and calls back on the loop,
which builds the responses; the credit goes back, and the answers and the completion leave in one
write. Every request gets an answer whatever fails: a request whose inputs cannot be read fails
alone, an error of the model fails the requests it names, anything else fails the rest of the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Coroutine
from functools import partial
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from services.worker.backends.runner import Batch, ModelError, RequestContext, Rescheduled, Result, Tensors, Work
from services.worker.batches.batch_run import BatchRun, enqueued, unreadable
from services.worker.batches.completions import Completions
from services.worker.batches.decoupled_streams import Cancellations, DecoupledSenders
from services.worker.batches.instances import Instance, LoadedModel
from services.worker.batches.replies import Replies
from services.worker.batches.response_outputs import Outputs
from services.worker.sequences.controls import flags
from shared.bus import eager, hot_path
from shared.bus.hot_path import Outgoing
from shared.bus.local_channel import FrameSink
from shared.bus.tensor_store import TensorStore
from shared.config.datatypes import from_bytes
from shared.errors import Code, ShoalError
from shared.tracing import spans
from shared.wire import subjects
from shared.wire.deadlines import seconds_left
from shared.wire.messages import ExecBatch, InferRequest, InferResponse, InstanceFree, RequestDone, SeqControl

log = logging.getLogger("shoal.worker")
_request_decoder = msgspec.msgpack.Decoder(InferRequest)


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
        local: str = "",
    ) -> None:
        self.worker_id = worker_id
        self.local = local  # this worker's local channel, named in its credits (docs/design.md §9)
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
            local=self.local,
            generation=batch.generation,
            batch_id=batch.batch_id,
        )

    async def fail(self, batch: ExecBatch, message: str, channel: FrameSink | None = None) -> None:
        """A batch this worker cannot run (its model is not loaded here)."""
        replies = Replies(batch.reply_via_scheduler)
        for raw in batch.requests:
            request = _request_decoder.decode(raw)
            replies.add(request, InferResponse(request.rid, error=message, code=str(Code.UNAVAILABLE)))
        # instance -1: not a credit, the scheduler must not send here again
        await self._finish(replies, self._free(batch, -1), batch.complete_to, channel)

    # -- arrival and inputs ----------------------------------------------------------------
    def start(
        self,
        loaded: LoadedModel,
        instance: Instance,
        batch: ExecBatch,
        holds_credit: bool,
        channel: FrameSink | None = None,
    ) -> Coroutine[Any, Any, None] | None:
        """Run a batch. Returns a coroutine to run as a Task when its inputs must be fetched on the
        loop first (not all inline), else None: the common case needs no Task (per batch, a Task,
        its first step and its wake-up saved). Either way the batch goes on at `_compute`."""
        self.holding.add(batch.batch_id)
        run = BatchRun(loaded, instance, batch, holds_credit, self._free(batch, batch.instance), channel)
        live = run.arrived([_request_decoder.decode(raw) for raw in batch.requests])
        if any(ref.data is None for request in live for ref in request.inputs):
            return self._fetch(run, live)
        readable = []
        for request in live:
            inputs = self._inline_inputs(run, request)
            if inputs is not None:
                readable.append((request, inputs))
        self._compute(run, readable)
        return None

    def run_here(
        self,
        loaded: LoadedModel,
        instance: Instance,
        batch: ExecBatch,
        requests: list[InferRequest],
        channel: FrameSink,
    ) -> None:
        """A credited batch run to its end on the thread that read it from its local channel (the hot
        loop of a python model's instance process, docs/design.md §9, `hot_loop.HotLoop`): `start`'s
        steps, the model called on this thread instead of the instance's, the answers written on
        `channel` from here; only what must cross NATS goes to the event loop."""
        self.holding.add(batch.batch_id)
        run = BatchRun(loaded, instance, batch, True, self._free(batch, batch.instance), channel)
        run.here = True
        readable = []
        for request in run.arrived(requests):
            inputs = self._inline_inputs(run, request)
            if inputs is not None:
                readable.append((request, inputs))
        self._compute(run, readable)

    @staticmethod
    def _inline_inputs(run: BatchRun, request: InferRequest) -> Tensors | None:
        """A request's input tensors, all inline; None when they cannot be read (it is answered
        with the error)."""
        try:
            inputs = {ref.name: from_bytes(ref.data, ref.datatype, ref.shape) for ref in request.inputs}  # type: ignore[arg-type]
            return run.with_controls(request, inputs) if run.controls else inputs
        except Exception as exc:
            run.replies.add(request, unreadable(request, exc))
            return None

    async def _fetch(self, run: BatchRun, live: list[InferRequest]) -> None:
        """`start` for a batch whose inputs are fetched from the tensor store first."""
        readable = []
        try:
            for request in live:
                try:
                    timeout = seconds_left(request.deadline_ns, 0.1)
                    inputs = {
                        ref.name: from_bytes(await self.store.get(ref, timeout), ref.datatype, ref.shape)
                        for ref in request.inputs
                    }
                    readable.append((request, run.with_controls(request, inputs)))
                except Exception as exc:  # this request fails alone
                    run.replies.add(request, unreadable(request, exc))
        except BaseException:  # cancelled (the worker stops): what is answered goes, with the completion
            self._end(run)
            raise
        self._compute(run, readable)

    # -- compute ---------------------------------------------------------------------------
    def _compute(self, run: BatchRun, readable: list[tuple[InferRequest, Tensors]]) -> None:
        """The readable requests to the instance's thread, which calls `_computed` back on the loop;
        on the hot loop (`run.here`) the model runs on this thread and `_computed` follows at once."""
        here: tuple[list[Result] | None, BaseException | None] | None = None
        try:
            if readable:
                run.ran = [request for request, _ in readable]
                every = [o.name for o in run.loaded.spec.outputs]
                work = [Work(inputs, r.outputs or every, r.batch_size, self._context(run, r)) for r, inputs in readable]
                model_batch = run.model_batch(work)
                instance = run.instance
                if run.here:
                    here = _execute_here(instance, model_batch)
                else:
                    context = contextvars.copy_context()  # this batch's log lines, on the loop again
                    done = partial(self._computed, run, model_batch)
                    instance.executor.call(
                        _execute, (instance, model_batch), lambda r, e: context.run(done, r, e), self.loop
                    )
                    return
        except Exception as exc:  # never lose a request: every one gets an answer
            self._ended(run.requests)
            self._failed(run, exc)
        if here is not None:
            self._computed(run, model_batch, here[0], here[1])
            return
        self._end(run)

    def _computed(
        self, run: BatchRun, model_batch: Batch, results: list[Result] | None, error: BaseException | None
    ) -> None:
        """Back on the loop with what the model made of the batch."""
        try:
            self._ended(run.ran)
            if error is not None:
                raise error
            assert results is not None
            self._respond(run, run.results(model_batch, results))
        except Exception as exc:
            self._failed(run, exc)
        finally:
            self._end(run)

    def _context(self, run: BatchRun, request: InferRequest) -> RequestContext:
        """What a model can ask of a request besides its tensors."""
        params = request.parameters
        custom = {k: v for k, v in params.items() if k not in ("sequence_id", "sequence_start", "sequence_end")}
        control = run.controls.get(request.rid)
        if control is None:  # not sequence-batched: the flags as the client sent them, as Triton passes them on
            control = SeqControl(
                corrid=request.sequence_id, seq=0, start=request.sequence_start, end=request.sequence_end
            )
        self.cancellations.started(request)
        spec = run.loaded.spec
        stream = None
        if spec.decoupled:  # kept with the batch: its first response's time goes with the completion
            stream = run.streams[request.rid] = self.decoupled.stream(spec, run.loaded.version, request)
        return RequestContext(
            request_id=request.id,
            correlation_id=control.corrid,
            flags=flags(control),
            parameters=custom,
            timeout_us=request.timeout_us,
            cancelled=lambda: self.cancellations.is_cancelled(request),
            responses=stream,
            trace=(request.traceparent, request.tracestate) if request.traceparent else None,
        )

    def _ended(self, requests: list[InferRequest]) -> None:
        """The model returned: requests it does not stream any more can no longer be cancelled."""
        for request in requests:
            if request.rid not in self.decoupled.open:
                self.cancellations.ended(request.rid)

    # -- respond ---------------------------------------------------------------------------
    def _respond(self, run: BatchRun, results: list[Result]) -> None:
        loaded = run.loaded
        spec, states = loaded.spec, loaded.states
        t_out = time.monotonic_ns()
        for request, result in zip(run.ran, results):
            control = run.controls.get(request.rid)
            if control is not None and states is not None and isinstance(result, dict):
                states.keep(control, result)
            if isinstance(result, Rescheduled):  # no answer now: the scheduler queues it again
                run.replies.done.append(RequestDone(rid=request.rid, ok=True, rescheduled=True))
                continue
            if spec.decoupled:  # the model's stream answers; an error ends it unless it did already
                if isinstance(result, ModelError):
                    self.decoupled.fail(request, result.message, result.code)
                stream = run.streams.get(request.rid)
                first = stream.report() if stream is not None else 0  # the scheduler's first-response time
                ok = not isinstance(result, ModelError)
                run.replies.done.append(RequestDone(rid=request.rid, ok=ok, first_response_ns=first))
                continue
            response = self._response(loaded, request, result, run.batch.reply_via_scheduler)
            if request.trace:
                response.trace = {
                    "COMPUTE_START": run.started_ns,
                    "COMPUTE_INPUT_END": run.inputs_ns,
                    "COMPUTE_OUTPUT_START": t_out,
                    "COMPUTE_END": time.monotonic_ns(),
                }
                queued = enqueued(run.batch, run.requests).get(request.rid)
                if queued:
                    response.trace["QUEUE_START"] = queued
                response.batch = run.delivery(self.worker_id)
            run.replies.add(request, response)
        computed = time.monotonic_ns()
        run.free.compute_output_ns = computed - t_out
        if spans.active is not None:  # opentelemetry mode (one comparison when off)
            compute_spans(spans.active, run, (run.started_ns, run.inputs_ns, t_out, computed), self.worker_id)

    def _response(self, loaded: LoadedModel, request: InferRequest, result: Result, small: bool) -> InferResponse:
        try:
            if isinstance(result, ModelError):  # the model answered this request with an error
                raise ShoalError(result.message, result.code)
            if not isinstance(result, dict):
                raise ShoalError("the model streamed the responses of a model that is not decoupled", Code.INTERNAL)
            return self.outputs.response(loaded.spec, loaded.version, request, result, small)
        except ShoalError as exc:  # this request's problem (e.g. its output region is too small)
            return InferResponse(request.rid, error=exc.message, code=str(exc.code))
        except Exception as failure:  # another name than the ShoalError's: compiled, a local has one type
            return InferResponse(request.rid, error=f"cannot deliver the outputs: {failure}", code=str(Code.INTERNAL))

    @staticmethod
    def _failed(run: BatchRun, exc: BaseException) -> None:
        """The batch failed: every request not answered yet gets the error."""
        log.error("batch %d of '%s' failed", run.batch.batch_id, run.batch.model, exc_info=exc)
        answered = run.replies.answered()
        code = exc.code if isinstance(exc, ShoalError) else Code.INTERNAL
        for request in run.requests:
            if request.rid not in answered:
                run.replies.add(request, InferResponse(request.rid, error=str(exc), code=str(code)))

    # -- the end: the credit back, the answers and the completion out ---------------------------
    def _end(self, run: BatchRun) -> None:
        run.settle()
        self._finish_now(run.replies, run.free, run.batch.complete_to, run.channel, run.here)

    async def _finish(
        self, replies: Replies, free: InstanceFree, complete_to: str, channel: FrameSink | None = None
    ) -> None:
        self.holding.discard(free.batch_id)
        await self._send(*self._messages(replies, free, complete_to, channel), free.batch_id)

    def _finish_now(
        self, replies: Replies, free: InstanceFree, complete_to: str, channel: FrameSink | None, here: bool = False
    ) -> None:
        """`_finish` from a callback: written at once in the common case, else by a coroutine. `here`:
        called on the hot loop's thread, where what must cross NATS is handed to the event loop."""
        self.holding.discard(free.batch_id)
        messages, completion = self._messages(replies, free, complete_to, channel)
        if not messages and completion is None:  # all of it went by the local channel
            return
        if here:  # nats-py is the event loop's alone
            try:
                self.loop.call_soon_threadsafe(self._publish_now, messages, completion, free.batch_id)
            except RuntimeError:  # the loop closed (the worker stopped): nobody is left to send them
                log.warning("batch %d ended after the worker stopped; its answers are lost", free.batch_id)
            return
        self._publish_now(messages, completion, free.batch_id)

    def _publish_now(self, messages: list[Outgoing], completion: Outgoing | None, batch_id: int) -> None:
        everything = [*messages, completion] if completion is not None else messages
        with contextlib.suppress(Exception):  # `_send` tries again and reports
            if hot_path.publish_now(self.nc, everything):
                return
        eager.start(self._send(messages, completion, batch_id))

    async def _send(self, messages: list[Outgoing], completion: Outgoing | None, batch_id: int) -> None:
        """The answers, then the completion (None: it went by the local channel), in one write; a
        failure of the answers must not lose the completion."""
        everything = [*messages, completion] if completion is not None else messages
        try:
            if everything and not hot_path.publish_now(self.nc, everything):
                await hot_path.publish_all(self.nc, everything)
            return
        except Exception:  # both send all of the messages or none
            if messages:
                log.exception("could not send the responses of batch %d", batch_id)
        if completion is None:
            return
        try:
            await hot_path.publish_all(self.nc, [completion])
        except Exception:  # the scheduler expires the batch and returns the credit itself
            log.exception("could not report batch %d as done", batch_id)

    def _messages(
        self, replies: Replies, free: InstanceFree, complete_to: str, channel: FrameSink | None
    ) -> tuple[list[Outgoing], Outgoing | None]:
        """The answers for each gateway, and the completion: for a co-hosted scheduler
        (`complete_to`), its gateway's answers travel with the completion, written on the batch's
        local channel when it came by one still open (the completion is None then)."""
        together = replies.take(subjects.inbox_of(complete_to)) if complete_to else []
        try:
            messages = replies.messages(self.nc.max_payload)
        except Exception:
            log.exception("could not encode the responses of batch %d", free.batch_id)
            messages = []
        free.done = replies.done
        if not complete_to:
            return messages, self.completions.free_message(free)
        if channel is not None and self.completions.done_on(channel, free, together):
            return messages, None
        return messages, self.completions.done_message(complete_to, free, together)


def compute_spans(tracing: spans.Tracing, run: BatchRun, times: tuple[int, int, int, int], worker_id: str) -> None:
    """Triton's `compute` span of each traced request (under its model span, whose context the
    request carries): COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START and COMPUTE_END,
    and where it ran. The batch's requests share the times: they ran together."""
    delivery = run.delivery(worker_id)
    attributes: dict[str, str | int] = {
        "shoal.batch.size": delivery.batch_size,
        "shoal.batch.requests": delivery.batch_requests,
        "shoal.batch.reason": delivery.batch_reason,
        "shoal.worker": delivery.worker,
        "shoal.instance": delivery.instance,
        "shoal.batch.id": run.batch.batch_id,
    }
    for request in run.ran:
        if request.traceparent:
            span = tracing.start("compute", (request.traceparent, request.tracestate), times[0], attributes)
            for name, ns in zip(_COMPUTE_EVENTS, times):
                tracing.event(span, name, ns)
            tracing.end(span, times[3])


_COMPUTE_EVENTS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


def _execute(instance: Instance, batch: Batch) -> list[Result]:
    with instance.lock:  # the instance's thread and the hot loop's never run the model at once
        instance.executions += 1
        return instance.runner.execute(batch)


def _execute_here(instance: Instance, batch: Batch) -> tuple[list[Result] | None, BaseException | None]:
    """`_execute` on the calling thread, its outcome as the instance's thread hands it back."""
    try:
        return _execute(instance, batch), None
    except BaseException as exc:  # noqa: BLE001 - answered as the instance's thread answers it
        return None, exc
