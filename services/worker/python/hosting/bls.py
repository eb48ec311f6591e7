"""BLS: python models calling other models (`pb_utils.InferenceRequest(...).exec()`).

A BLS request is an ordinary client request: it is checked against the target's config,
goes through the target's scheduler (so it batches with everyone else's requests) and
its answer comes back to this worker's inbox. The worker is a small gateway for its
models: the same registry, dispatcher and inference core the HTTP gateway uses.

Model code calls in from an instance thread (or from the event loop an `async execute`
runs in on that thread); the request itself runs on the worker's event loop.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import logging
import queue
from collections.abc import Iterator
from pathlib import Path

from nats.aio.client import Client as NATS

from inference.core import InferenceCore
from inference.models import ModelRegistry
from inference.shm import ShmRegistry
from inference.types import InputTensor, OutputTensor, ParsedRequest, RequestedOutput, TraceFrom
from services.worker.python.triton_api import pb_utils
from shared.bus import dispatch_stream
from shared.bus.dispatch import Dispatcher
from shared.bus.repository_client import RepositoryRequest, repository_call
from shared.bus.tensor_store import TensorStore
from shared.config.datatypes import from_bytes, protocol_dtype, to_bytes
from shared.errors import Code, ShoalError
from shared.wire import subjects
from shared.wire.control import LoadRequest, UnloadRequest
from shared.wire.deadlines import seconds_left
from shared.wire.messages import InferRequest

log = logging.getLogger("shoal.worker")

DEFAULT_TIMEOUT_S = 60.0  # a BLS request made outside any request's deadline (e.g. in initialize)
REPOSITORY_TIMEOUT_S = 330.0  # a load waits for the workers, as an HTTP load request does
SYNC_TIMEOUT_S = 10.0  # the first BLS call waits at most this long for the view of the models


def triton_error(exc: ShoalError) -> pb_utils.TritonError:
    return pb_utils.TritonError(exc.message, pb_utils.TritonError.code_of(str(exc.code)))


class BlsRuntime:
    def __init__(self, nc: NATS, store: TensorStore, worker_id: str) -> None:
        self.nc = nc
        self.registry = ModelRegistry()
        self.dispatcher = Dispatcher(nc, subjects.token(f"{worker_id}-bls"), store)
        # BLS tensors never live in a client's shared memory: a disabled registry refuses any that claim to
        self.core = InferenceCore(
            self.registry, self.dispatcher, store, DEFAULT_TIMEOUT_S, shm=ShmRegistry(nc, store.host, False)
        )
        self.loop = asyncio.get_running_loop()
        self._started: asyncio.Future[None] | None = None

    async def start(self) -> None:
        pb_utils.install_runtime(self)

    async def _ensure_started(self) -> None:
        """The view of the models (a watch of the models bucket) and the dispatcher's inbox, set up
        by the first BLS call: most python models never make one, and a watch costs each process
        (one per instance of every python model) a JetStream consumer and its timers."""
        if self._started is None or (self._started.done() and self._started.exception() is not None):
            self._started = asyncio.ensure_future(self._start_parts())
        await asyncio.shield(self._started)

    async def _start_parts(self) -> None:
        await self.registry.start(self.nc)
        await self.dispatcher.start()
        # the current records first: a model the repository has is not "unknown" to the first call
        await self.registry.caught_up(SYNC_TIMEOUT_S)

    async def stop(self) -> None:
        await self.registry.stop()

    # -- pb_utils.Runtime ------------------------------------------------------------
    def infer(self, request: pb_utils.InferenceRequest, deadline_ns: int) -> pb_utils.InferenceResponse:
        future = asyncio.run_coroutine_threadsafe(self._infer(request, deadline_ns), self.loop)
        return future.result()

    async def async_infer(self, request: pb_utils.InferenceRequest, deadline_ns: int) -> pb_utils.InferenceResponse:
        future = asyncio.run_coroutine_threadsafe(self._infer(request, deadline_ns), self.loop)
        return await asyncio.wrap_future(future)

    def stream(self, request: pb_utils.InferenceRequest, deadline_ns: int) -> pb_utils.ResponseIterator:
        """A decoupled target's responses, in order, as python_backend's blocking iterator for model
        code. The request starts now (a model may start a few before reading any); a model that
        stops reading early cancels the rest (the target is told, as for a client disconnect).
        The iterator's `cancel()` tells the target and keeps reading: what the target sends until
        its final response (a CANCELLED error, or all it meant to send) still comes, as in Triton."""
        answers: queue.Queue = queue.Queue()
        done = object()
        cancelling = StreamCancel(self.dispatcher)

        async def pump() -> None:
            dispatch_stream.opened.set(cancelling.opened)  # this task's context only
            try:
                async for response in self._stream(request, deadline_ns):
                    answers.put(response)
            except Exception as exc:  # a bug here must end the model's loop, not hang it
                answers.put(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"BLS stream failed: {exc}")))
            finally:
                answers.put(done)

        future = asyncio.run_coroutine_threadsafe(pump(), self.loop)

        def responses() -> Iterator[pb_utils.InferenceResponse]:
            try:
                while (item := answers.get()) is not done:
                    yield item
            finally:
                future.cancel()  # closes the stream, whose cleanup sends the cancel

        def cancel() -> None:
            # python_backend's cancel() returns once the server has the cancellation
            asyncio.run_coroutine_threadsafe(cancelling.cancel(), self.loop).result()

        return pb_utils.ResponseIterator(responses(), cancel)

    def is_model_ready(self, model_name: str, model_version: str = "") -> bool:
        asyncio.run_coroutine_threadsafe(self._ensure_started(), self.loop).result()
        return self.registry.is_ready(model_name, str(model_version or ""))

    def load_model(self, model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
        """Load (or reload) a model, with a config and files as an HTTP client could give them."""
        parameters: dict = {"config": config} if config else {}
        for path, content in (files or {}).items():
            key = path if path.startswith("file:") else f"file:{path}"
            parameters[key] = base64.b64encode(content).decode()
        self._control(subjects.REPOSITORY_LOAD, LoadRequest(model_name, parameters))

    def unload_model(self, model_name: str, unload_dependents: bool = False) -> None:
        # a model unloading itself (vLLM's backend does, from `execute`, when its engine is unhealthy)
        # cannot wait for the unload: it drains the requests this very call is serving
        own = Path(pb_utils.get_model_dir()).parent.name == model_name
        self._control(subjects.REPOSITORY_UNLOAD, UnloadRequest(model_name, unload_dependents), wait=not own)

    def _control(self, subject: str, request: RepositoryRequest, wait: bool = True) -> None:
        async def call() -> None:
            await self._ensure_started()
            revision = await repository_call(self.nc, subject, request, REPOSITORY_TIMEOUT_S)
            await self.registry.seen(revision)  # the model's next BLS call sees it

        future = asyncio.run_coroutine_threadsafe(call(), self.loop)
        if not wait:  # Triton's unload returns once asked; a failure is logged
            future.add_done_callback(_log_failure)
            return
        try:
            future.result()
        except ShoalError as exc:
            raise pb_utils.TritonModelException(exc.message) from None

    # -- on the worker's loop ------------------------------------------------------------
    def _prepare(self, request: pb_utils.InferenceRequest, deadline_ns: int):
        version = request.model_version()
        spec, resolved = self.core.resolve(request.model_name(), "" if version < 0 else str(version))
        parameters = json_parameters(request)
        parsed = ParsedRequest(
            request.request_id(),
            [_input(tensor) for tensor in request.inputs()],
            [RequestedOutput(name, True) for name in request.requested_output_names()] or None,
            parameters,
        )
        timeout_s = seconds_left(deadline_ns) if deadline_ns else DEFAULT_TIMEOUT_S
        if request.timeout():  # microseconds, as Triton's
            timeout_s = min(timeout_s, request.timeout() / 1e6)
        return spec, resolved, parsed, max(0.001, timeout_s)

    async def _infer(self, request: pb_utils.InferenceRequest, deadline_ns: int) -> pb_utils.InferenceResponse:
        await self._ensure_started()
        try:
            spec, resolved, parsed, timeout_s = self._prepare(request, deadline_ns)
            answer = await self.core.infer(spec, resolved, parsed, timeout_s=timeout_s, trace=_trace(request))
        except ShoalError as exc:
            return pb_utils.InferenceResponse(error=triton_error(exc))
        return _response(answer.outputs, answer.parameters)

    async def _stream(self, request: pb_utils.InferenceRequest, deadline_ns: int):
        await self._ensure_started()
        try:
            spec, resolved, parsed, timeout_s = self._prepare(request, deadline_ns)
            async for item in self.core.stream(spec, resolved, parsed, timeout_s=timeout_s, trace=_trace(request)):
                if isinstance(item, ShoalError):
                    yield pb_utils.InferenceResponse(error=triton_error(item))
                else:
                    yield _response(item.outputs, item.parameters)
        except ShoalError as exc:
            yield pb_utils.InferenceResponse(error=triton_error(exc))


class StreamCancel:
    """A BLS stream's `cancel()`, on the worker's loop: the request is known once the stream opens
    it (`dispatch_stream.opened`); a cancel asked before that is sent when it opens."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.request: InferRequest | None = None
        self.wanted = False
        self.late: asyncio.Future[None] | None = None  # a cancel sent at the opening, held till done

    def opened(self, request: InferRequest) -> None:
        self.request = request
        if self.wanted:
            self.late = asyncio.ensure_future(self.dispatcher.cancel(request))

    async def cancel(self) -> None:
        if self.wanted:  # once, as Triton's: the flag only moves from false to true
            return
        self.wanted = True
        if self.request is not None:
            await self.dispatcher.cancel(self.request)


def _trace(request: pb_utils.InferenceRequest) -> TraceFrom | None:
    """A BLS request built with `trace=request.trace()` of a traced request: its spans go under
    that request's span (python_backend's way; without it, as in Triton, it is not traced)."""
    parent = request.trace().context
    return TraceFrom("", parent) if parent is not None else None


def json_parameters(request: pb_utils.InferenceRequest) -> dict:
    """The request's parameters plus its sequence fields, as a client would send them."""
    parameters = json.loads(request.parameters())
    if request.correlation_id():
        parameters["sequence_id"] = request.correlation_id()
        parameters["sequence_start"] = bool(request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
        parameters["sequence_end"] = bool(request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
    if request.timeout():
        parameters["timeout"] = request.timeout()
    return parameters


def _input(tensor: pb_utils.Tensor) -> InputTensor:
    array = tensor.as_numpy()
    datatype = protocol_dtype(array.dtype)
    return InputTensor(tensor.name(), datatype, list(array.shape), to_bytes(array, datatype))


def _data(output: OutputTensor) -> memoryview | bytes:
    if output.data is None:  # only a request naming a client's shared-memory region gets none; BLS never does
        raise ShoalError(f"output '{output.name}' was written into shared memory", Code.INTERNAL)
    return output.data


def _response(outputs: list[OutputTensor], parameters: dict) -> pb_utils.InferenceResponse:
    tensors = [pb_utils.Tensor(o.name, from_bytes(_data(o), o.datatype, o.shape)) for o in outputs]
    return pb_utils.InferenceResponse(output_tensors=tensors, parameters=parameters)


def _log_failure(future: concurrent.futures.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("a model's unload of itself failed: %s", future.exception())
