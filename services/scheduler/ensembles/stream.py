"""One request of a decoupled ensemble: many responses, one per iteration (docs/triton-spec.md §3.5).

The LLM-streaming pattern: preprocess -> decoupled generator -> postprocess. Each response
of a decoupled step opens an iteration (`ensemble_iterations.Scope`) whose downstream
steps run as ordinary step requests; each iteration that has every requested output sends
the client a response (`more=True`) at once; when every stream has ended and every
iteration's steps are done, an `empty` response with `more=False` ends the client's stream.
As Triton's `EnsembleContext::FinishEnsemble`: a response made when no step is left in flight
(the last one of a step that sent its final flag with it) is itself the final one (`more=False`),
with no empty response after it.

Only decoupled ensembles come here: the ordinary dataflow (`EnsembleRunner._execute`) is
untouched, so their behaviour and cost stay exactly as they were.

- An error in any step (or a step request that cannot be built) ends the stream with
  `in ensemble 'E', <message>`; everything in flight is cancelled (a decoupled step's stream
  sends its cancel when closed, so the generator sees `is_cancelled()`).
- `max_inflight_requests` bounds the requests in flight at each step across all the ensemble's
  requests (`step_slots.py`, as Triton since core PR 482); launches over the bound wait, in order,
  for a slot (backpressure against a fast producer).
- An iteration's intermediates are freed as soon as it is settled, not at the end, so a
  long stream holds only the iterations in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping
from typing import Protocol

import msgspec
from nats.aio.client import Client as NATS

from services.scheduler.ensembles.iterations import Scope, settle
from services.scheduler.ensembles.step import fit_batching, step_request
from services.scheduler.ensembles.step_slots import Slots, StepSlots, Waiter
from services.scheduler.ensembles.timing import StepLatency, compute_phases
from shared.bus.dispatch import Dispatcher
from shared.bus.tensor_store import TensorStore
from shared.config.ensemble_graph import EnsembleGraph, Step, is_decoupled, max_inflight
from shared.config.model_config import ModelSpec
from shared.errors import Code, ShoalError
from shared.wire.deadlines import seconds_left
from shared.wire.messages import InferRequest, InferResponse, TensorRef, encode

log = logging.getLogger("shoal.scheduler.ensemble")

# (scope the step ran in, the step, one response, whether it is the step's last)
_Event = tuple[Scope[TensorRef], Step, InferResponse, bool]


class Members(Protocol):
    """What a stream needs from the ensemble runner (implemented by `runner.EnsembleRunner`)."""

    @property
    def nc(self) -> NATS: ...
    @property
    def store(self) -> TensorStore: ...
    @property
    def dispatcher(self) -> Dispatcher: ...
    @property
    def specs(self) -> Mapping[str, ModelSpec]: ...  # every model's serving spec
    @property
    def ready(self) -> Mapping[str, list[int]]: ...  # model -> its READY versions
    @property
    def steps(self) -> dict[tuple[str, int], dict[str, StepLatency]]: ...  # ensemble -> member -> latency
    @property
    def slots(self) -> StepSlots: ...  # each ensemble step's `max_inflight_requests` limiter

    async def call(self, request: InferRequest) -> InferResponse: ...  # one step request, answered


class StreamFailed(Exception):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class EnsembleStream:
    """Runs one request; `run()` publishes its responses and returns the summed compute times."""

    def __init__(self, runner: Members, request: InferRequest, graph: EnsembleGraph) -> None:
        self.runner = runner
        self.request = msgspec.structs.replace(request, output_regions={})  # a region cannot hold N answers
        self.graph = graph
        self.requested = list(request.outputs) or list(graph.outputs)
        self.steps = graph.needed_steps(self.requested)
        self.readers = graph.consumers(self.steps)
        self.spec = runner.specs.get(request.model)
        configs = {name: spec.config for name, spec in runner.specs.items()}
        self.decoupled = {s.index: is_decoupled(s.model, configs) for s in self.steps}
        limit = max_inflight(self.spec.config) if self.spec is not None else 0
        key = (request.model, request.version)
        self.slots: dict[int, Slots] = {s.index: runner.slots.for_step(key, limit, s.index) for s in self.steps}
        self.inflight: dict[int, int] = {s.index: 0 for s in self.steps}  # slots this request holds
        self.held: dict[int, deque[tuple[Scope[TensorRef], Step]]] = {s.index: deque() for s in self.steps}
        self.waiters: dict[int, deque[Waiter]] = {s.index: deque() for s in self.steps}  # `held`'s asks
        self.events: asyncio.Queue[_Event] = asyncio.Queue()
        self.tasks: set[asyncio.Task[None]] = set()
        self.owned: dict[int, TensorRef] = {}  # id -> step outputs not yet freed or handed over
        self.compute = [0, 0, 0]
        self.started: dict[str, int] = {}  # step rid -> when it left (monotonic ns): its latency
        self.streams: dict[str, tuple[asyncio.Task[None], Scope[TensorRef], Step]] = {}  # decoupled steps running
        self.error: StreamFailed | None = None  # the first failure: nothing new starts, then it ends the stream
        self.latencies = runner.steps.setdefault((request.model, request.version), {})
        self.last: InferResponse | None = None  # an answer made with nothing in flight: the final one
        self.first_ns = 0  # when the first answer went to the client (wall clock); 0: none yet

    async def run(self) -> list[int]:
        """Raises `StreamFailed` (published by the caller) on a step error."""
        root: Scope[TensorRef] = Scope(path=())
        root.tensors = {ref.name: ref for ref in self.request.inputs}  # the gateway's: never freed here
        batched = bool(self.spec and self.spec.max_batch_size > 0)
        root.batched = {name: batched for name in root.tensors}
        try:
            await self._advance(root)
            await self._settle(root)
            while not root.settled:
                await self._handle(*await self.events.get())
                await self._settle(root)
        finally:
            for task in self.tasks:
                task.cancel()  # a stream's cancel reaches its model; a plain request leaves its queue
            self._give_up_slots()
            while not self.events.empty():  # answered just now: nobody reads these
                self.owned.update((id(ref), ref) for ref in self.events.get_nowait()[2].outputs)
            if self.owned:
                await self.runner.store.release_remote(list(self.owned.values()))
        if self.error is not None:
            raise self.error
        return self.compute

    async def _handle(self, scope: Scope[TensorRef], step: Step, response: InferResponse, last: bool) -> None:
        """One response of one step request."""
        self.owned.update((id(ref), ref) for ref in response.outputs)  # ours to free until handed over
        decoupled = self.decoupled[step.index]
        if decoupled and self.error is not None and response.rid:
            return  # a stream cancelled by the failure (its accounting is done): leftovers
        if last or response.error:
            begun = self.started.pop(response.rid, None) or time.monotonic_ns()
            latency = self.latencies.setdefault(step.model, StepLatency())
            (latency.fail if response.error else latency.success).add(time.monotonic_ns() - begun)
        if response.error:
            streaming = response.rid in self.streams  # accounted for by `_stop`
            if self.error is None:
                self.error = StreamFailed(response.error, response.code or Code.INTERNAL)
                self._stop()
            if last and not streaming:
                self._done(scope, step)
            return
        for i, ns in enumerate(compute_phases(response.trace)):
            self.compute[i] += ns
        if decoupled:
            if last:  # ended before its iteration advances: an answer it completes may be the final one
                self.streams.pop(response.rid, None)
                self._done(scope, step)
            if response.outputs and not response.empty:
                child = scope.child()
                self._store(child, step, response)
                await self._advance(child)
        else:
            self._store(scope, step, response)
            self._done(scope, step)
            await self._advance(scope)  # its live iterations see the new tensors too

    def _done(self, scope: Scope[TensorRef], step: Step) -> None:
        """A step request of `scope` has ended: its slot goes to the next held launch."""
        scope.running -= 1
        if not self.decoupled[step.index]:
            scope.producing -= 1
        self._free(step.index)  # the slot may go to a launch of this request or of another one

    def _stop(self) -> None:
        """After a failure: no new step starts and the decoupled streams are cancelled (their
        models see `is_cancelled()`); the plain step requests in flight drain, and the
        iterations they complete still reach the client before the error does (Triton
        drains in-flight steps too)."""
        for waiters in self.waiters.values():  # first: a slot freed below must not start one of ours
            for waiter in waiters:
                waiter.withdraw()
            waiters.clear()
        for task, scope, step in self.streams.values():
            task.cancel()
            scope.running -= 1
            self._free(step.index)
        self.streams.clear()
        for index, queue in self.held.items():
            for scope, _step in queue:
                scope.running -= 1
                if not self.decoupled[index]:
                    scope.producing -= 1
            queue.clear()

    # -- steps ---------------------------------------------------------------------------
    async def _advance(self, scope: Scope[TensorRef]) -> None:
        """Start what became runnable in `scope` and below; answer the iterations that can."""
        for current in list(scope.walk()):
            for step in current.ready_steps(self.steps) if self.error is None else ():
                current.launched.add(step.index)
                current.running += 1
                if not self.decoupled[step.index]:
                    current.producing += 1
                self._hold(current, step)
            if current.due(self.requested):
                await self._answer(current)

    def _hold(self, scope: Scope[TensorRef], step: Step) -> None:
        """A launch waits for a slot of its step (granted at once under the bound, or without one)."""
        index = step.index
        self.held[index].append((scope, step))
        waiter = Waiter(lambda: self._granted(index))
        self.waiters[index].append(waiter)
        self.slots[index].ask(waiter)

    def _granted(self, index: int) -> bool:
        """A slot of step `index` is ours: slots come in the order asked, so it is the oldest launch's."""
        scope, step = self.held[index].popleft()
        self.waiters[index].popleft()
        self.inflight[index] += 1
        self._start(scope, step)
        return True

    def _free(self, index: int) -> None:
        self.inflight[index] -= 1
        self.slots[index].give_back()

    def _give_up_slots(self) -> None:
        """The request is over (or cancelled): what it holds or waits for goes to the others."""
        for index, waiters in self.waiters.items():
            for waiter in waiters:
                waiter.withdraw()
            waiters.clear()
            self.held[index].clear()
            if self.inflight[index]:
                self.slots[index].give_back(self.inflight[index])
                self.inflight[index] = 0

    def _start(self, scope: Scope[TensorRef], step: Step) -> None:
        tensors = scope.visible()
        batched = {name: scope.is_batched(name) for name in tensors}
        try:
            sub = step_request(
                self.request,
                step,
                tensors,
                batched,
                self.requested,
                self.readers,
                self.runner.specs,
                self.runner.ready,
                self.runner.dispatcher,
            )
        except ShoalError as exc:  # the member's own validation text, as a failed step
            self.events.put_nowait((scope, step, InferResponse(rid="", error=exc.message, code=str(exc.code)), True))
            return
        self.started[sub.rid] = time.monotonic_ns()
        task = asyncio.create_task(
            self._stream(scope, step, sub) if self.decoupled[step.index] else self._call(scope, step, sub)
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if self.decoupled[step.index]:
            self.streams[sub.rid] = (task, scope, step)

    async def _call(self, scope: Scope[TensorRef], step: Step, sub: InferRequest) -> None:
        response = await self.runner.call(sub)
        self.events.put_nowait((scope, step, response, True))

    async def _stream(self, scope: Scope[TensorRef], step: Step, sub: InferRequest) -> None:
        timeout = seconds_left(sub.deadline_ns, 0.001)
        try:
            async for response in self.runner.dispatcher.stream(sub, timeout):
                self.events.put_nowait((scope, step, response, not response.more))
        except ShoalError as exc:  # past the deadline, or the member is unreachable
            self.events.put_nowait(
                (scope, step, InferResponse(rid=sub.rid, error=exc.message, code=str(exc.code)), True)
            )

    # -- tensors -------------------------------------------------------------------------
    def _store(self, scope: Scope[TensorRef], step: Step, response: InferResponse) -> None:
        member = self.runner.specs.get(step.model)
        for ref in response.outputs:
            tensor = step.output_map.get(ref.name)
            if tensor is not None:
                scope.tensors[tensor] = ref
                scope.batched[tensor] = bool(member and member.max_batch_size > 0)

    async def _settle(self, root: Scope[TensorRef]) -> None:
        """Free the intermediates of every iteration that is done."""
        freed = []
        for scope in settle(root):
            for ref in scope.tensors.values():
                if self.owned.pop(id(ref), None) is not None:
                    freed.append(ref)
        if freed:
            await self.runner.store.release_remote(freed)

    async def _answer(self, scope: Scope[TensorRef]) -> None:
        """One response to the client: the iteration's own outputs are handed over (the gateway
        frees them after reading); an output from an ancestor, which later iterations send too,
        goes as a copy."""
        scope.answered = True
        outputs = []
        for name in self.requested:
            ref = scope.lookup(name)
            assert ref is not None  # due() checked
            if name in scope.tensors:
                self.owned.pop(id(ref), None)
            elif ref.data is None:
                timeout = seconds_left(self.request.deadline_ns, 0.1)
                data = await self.runner.store.get(ref, timeout)
                ref = TensorRef(name=ref.name, datatype=ref.datatype, shape=list(ref.shape), data=bytes(data))
            config = self.spec.output(name) if self.spec is not None else None
            shape = (
                fit_batching(config.dims, self.spec.max_batch_size > 0, ref.shape, scope.is_batched(name))
                if config is not None and self.spec is not None
                else ref.shape
            )
            outputs.append(msgspec.structs.replace(ref, name=name, shape=shape))
        response = InferResponse(
            rid=self.request.rid, model=self.request.model, version=self.request.version, outputs=outputs, more=True
        )
        if self.last is not None:  # another answer came after all: that one was not the last
            self.first_ns = self.first_ns or time.time_ns()
            await self.runner.nc.publish(self.request.reply, encode(self.last))
            self.last = None
        if self._quiet():
            self.last = response  # `finish` sends it, final, once the stream has ended
            return
        self.first_ns = self.first_ns or time.time_ns()
        await self.runner.nc.publish(self.request.reply, encode(response))

    def _quiet(self) -> bool:
        """No step in flight, held or answered unread, no failure: nothing more can come."""
        return (
            self.error is None
            and not any(self.inflight.values())
            and not any(self.held.values())
            and self.events.empty()
        )


async def finish(
    runner: Members, request: InferRequest, error: StreamFailed | None, last: InferResponse | None = None
) -> None:
    """The last message of the client's stream: the final flag (on `last`, the stream's answer made
    with nothing left in flight, where there is one), or the error that ended it."""
    if last is not None and error is None:
        response = msgspec.structs.replace(last, more=False)
    elif error is None:
        response = InferResponse(rid=request.rid, empty=True)
    else:
        response = InferResponse(
            rid=request.rid, error=f"in ensemble '{request.model}', {error.message}", code=str(error.code)
        )
    try:
        if last is not None and error is not None:
            await runner.nc.publish(request.reply, encode(last))
        await runner.nc.publish(request.reply, encode(response))
    except Exception:  # the gateway's stream times out
        log.exception("cannot end ensemble stream %s", request.rid)
