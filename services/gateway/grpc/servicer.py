"""Triton's `inference.GRPCInferenceService` on grpcio's asyncio server: each RPC decodes its
message, calls the inference core or server (`inference/`) and encodes the answer.

A cancelled call (or a closed stream) cancels the handler's task; the dispatcher then tells
the scheduler, and the request leaves its queue, as for an HTTP client that disconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from inference.core import trace_from
from inference.header_forwarding import forwarder
from inference.on_demand import request_timeout_s
from inference.server import InferenceServer
from inference.types import TraceFrom
from services.gateway.grpc import convert
from shared.config import triton_protos
from shared.config.model_config import ModelSpec
from shared.errors import Code, ShoalError, invalid

pb: Any = triton_protos.load("service_pb2")
service_pb2_grpc: Any = triton_protos.load("service_pb2_grpc")

log = logging.getLogger("shoal.gateway")

MODEL_INFER = "ModelInfer RPC"  # how Triton names this endpoint when it refuses a decoupled model

# --grpc-restricted-protocol categories, as tritonserver groups the RPCs
CATEGORY = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}

Restrictions = dict[str, tuple[str, str]]  # category -> (header, value)


def version_of(text: str) -> str:
    """A request's model version string ('' = the latest), checked as Triton's GetModelVersionFromString."""
    if text and not text.isdigit():
        raise invalid(
            f"failed to get model version from specified version string '{text}' (details: stoll), "
            "version should be an integral value > 0"
        )
    return text


class Inbox:
    """A stream's answers on their way from its requests' tasks to its response iterator: an
    asyncio.Queue without the running-loop look-up that Queue.get makes each time it waits, that
    counts the tensor bytes it holds (`unread`): what a client that stops reading leaves here."""

    __slots__ = ("_loop", "_items", "_waiter", "unread")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[tuple[Any, int]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.unread = 0

    def put_nowait(self, item: Any, size: int = 0) -> None:
        self._items.append((item, size))
        self.unread += size
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Any:
        while not self._items:
            self._waiter = self._loop.create_future()
            await self._waiter
        item, size = self._items.popleft()
        self.unread -= size
        return item


def _tensor_bytes(message: Any) -> int:
    """A stream response's output bytes (what makes a held response large)."""
    if isinstance(message, pb.ModelStreamInferResponse):
        return sum(len(raw) for raw in message.infer_response.raw_output_contents)
    return 0


def unread_error(unread: int, limit: int) -> ShoalError:
    return ShoalError(
        f"the client has not read {unread} bytes of this stream's responses (the limit is {limit}): "
        "the request is cancelled",
        Code.UNAVAILABLE,
    )


def _rpc(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Triton's status and text for every failure; the restricted-protocol check first."""

    @functools.wraps(method)
    async def wrapped(self: GrpcService, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            self.check_allowed(method.__name__, context)
            return await method(self, request, context)
        except ShoalError as exc:
            await context.abort(convert.status_code(exc), exc.message)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # a bug must still answer, and the server keeps serving
            log.exception("unhandled error in %s", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc}")

    return wrapped


def _metadata(context: Any) -> list[tuple[str, str]]:
    """The call's metadata as (key, text value) pairs (binary `-bin` values left out)."""
    return [(key, value) for key, value in (context.invocation_metadata() or ()) if isinstance(value, str)]


def _trace(metadata: list[tuple[str, str]]) -> TraceFrom:
    """The W3C context a call's metadata brings (OpenTelemetry trace mode)."""
    found = {key: value for key, value in metadata if key in ("traceparent", "tracestate")}
    return trace_from("GRPC", found.get("traceparent"), found.get("tracestate"))


class GrpcService(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self,
        server: InferenceServer,
        restrictions: Restrictions | None = None,
        compress: bool = False,
        header_forward_pattern: str = "",
        stream_unread_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.server = server
        # a stream's responses held for a client that does not read them: past this, the request
        # that produces them is cancelled (bounded memory; docs/reliability.md, "Overload")
        self.stream_unread_bytes = stream_unread_bytes
        self.core = server.core
        self.restrictions = restrictions or {}
        self.compress = compress
        self.forward = forwarder(header_forward_pattern)

    def check_allowed(self, rpc: str, context: grpc.aio.ServicerContext) -> None:
        restriction = self.restrictions.get(CATEGORY[rpc])
        if restriction is None:
            return
        header, expected = restriction
        if dict(context.invocation_metadata() or ()).get(header) != expected:
            raise ShoalError(f"This protocol is restricted, expecting header '{header}'", Code.UNAVAILABLE)

    # -- health and metadata --------------------------------------------------------------
    @_rpc
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @_rpc
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.server.ready())

    @_rpc
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        # ready=false, not an error, for an unknown model too: tritonserver 2.51 (docs/compatibility.md)
        return pb.ModelReadyResponse(ready=await self.server.model_is_ready(request.name, version_of(request.version)))

    @_rpc
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**self.server.metadata())

    @_rpc
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        return convert.model_metadata(self.server.model_metadata(request.name, version_of(request.version)))

    @_rpc
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        return convert.model_config(self.server.model_config(request.name, version_of(request.version)))

    @_rpc
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        entries = await self.server.statistics(request.name, version_of(request.version))
        return convert.statistics(entries)

    # -- inference ------------------------------------------------------------------------
    @_rpc
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        spec, version = await self._resolve(request)
        parsed, _ = convert.parse_infer(request)
        if self.forward is not None:
            self.forward.forward(_metadata(context), parsed.parameters)
        trace = _trace(_metadata(context)) if self.core.spans else None
        answer = await self.core.infer(spec, version, parsed, endpoint=MODEL_INFER, trace=trace)
        if self.compress:
            context.set_compression(grpc.Compression.Gzip)
        return convert.infer_response(answer)

    async def _resolve(self, request: pb.ModelInferRequest) -> tuple[ModelSpec, int]:
        """The request's model (`load_on_demand`: one this view does not have yet is looked for
        again; one that loads on demand is loaded first, bounded by the request's timeout)."""
        version = version_of(request.model_version)
        try:
            return self.core.resolve(request.model_name, version)
        except ShoalError as exc:
            timeout = request.parameters["timeout"].int64_param if "timeout" in request.parameters else None
            return await self.core.load_on_demand(
                request.model_name, version, exc, request_timeout_s({"timeout": timeout})
            )

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Many requests on one stream, each answered as its responses come (in any order,
        matched by id); a failed request is an error message on the stream, which goes on. With
        the stream's metadata `triton_grpc_error: true` (Triton's error mode for streams) the first
        error ends the stream instead, as a gRPC status with the error's code and text."""
        try:
            self.check_allowed("ModelStreamInfer", context)
        except ShoalError as exc:
            await context.abort(convert.status_code(exc), exc.message)
        metadata = _metadata(context)
        error_mode = any(key == "triton_grpc_error" and value == "true" for key, value in metadata)
        if self.compress:
            context.set_compression(grpc.Compression.Gzip)
        loop = asyncio.get_running_loop()  # once per stream: in Python 3.11 each look-up is a getpid system call
        out = Inbox(loop)
        done = object()
        tasks: set[asyncio.Task[None]] = set()
        pending = 1  # the reader, and one per request in flight

        async def answer(request: pb.ModelInferRequest) -> None:
            try:
                async with contextlib.aclosing(self._stream_answers(request, metadata)) as answers:
                    async for message in answers:
                        if out.unread > self.stream_unread_bytes and not isinstance(message, tuple):
                            # closing the answers cancels the model's work for it
                            out.put_nowait((unread_error(out.unread, self.stream_unread_bytes), request))
                            break
                        out.put_nowait(message, _tensor_bytes(message))
            finally:
                out.put_nowait(done)

        async def read() -> None:
            nonlocal pending
            try:
                async for request in request_iterator:
                    pending += 1
                    task = loop.create_task(answer(request))  # starts in arrival order: sequences stay ordered
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            finally:
                out.put_nowait(done)

        reader = loop.create_task(read())
        try:
            while pending:
                item = await out.get()
                if item is done:
                    pending -= 1
                    continue
                if isinstance(item, tuple):  # (error, request): a failed request
                    error, failed = item
                    if error_mode:
                        await context.abort(convert.status_code(error), error.message)
                    item = convert.stream_error(error, failed)
                yield item
        finally:  # the client closed or cancelled the stream: requests still queued leave their queues
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    async def _stream_answers(
        self, request: pb.ModelInferRequest, metadata: list[tuple[str, str]]
    ) -> AsyncGenerator[pb.ModelStreamInferResponse | tuple[ShoalError, pb.ModelInferRequest], None]:
        try:
            spec, version = await self._resolve(request)
            parsed, empty_final = convert.parse_infer(request)
            if self.forward is not None:
                self.forward.forward(metadata, parsed.parameters)
            trace = _trace(metadata) if self.core.spans else None
            if not spec.decoupled:
                answer = await self.core.infer(spec, version, parsed, endpoint=MODEL_INFER, trace=trace)
                yield pb.ModelStreamInferResponse(infer_response=convert.infer_response(answer, stream=True))
                return
            stream = self.core.stream(spec, version, parsed, empty_final=empty_final, trace=trace)
            async with contextlib.aclosing(stream) as items:  # closed early: the request is cancelled
                async for item in items:
                    if isinstance(item, ShoalError):
                        yield item, request
                    else:
                        yield pb.ModelStreamInferResponse(infer_response=convert.infer_response(item, stream=True))
        except ShoalError as exc:
            yield exc, request
        except Exception as exc:  # a bug fails this request, not the stream
            log.exception("unhandled error on a stream request")
            yield ShoalError(f"internal error: {exc}", Code.INTERNAL), request

    # -- model repository -------------------------------------------------------------------
    @_rpc
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        return convert.repository_index(await self.server.repository_index(request.ready))

    @_rpc
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        await self.server.load(request.model_name, convert.load_parameters(request.parameters))
        return pb.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        dependents = False
        if "unload_dependents" in request.parameters:
            param = request.parameters["unload_dependents"]
            if param.WhichOneof("parameter_choice") != "bool_param":
                raise invalid("Unable to parse 'unload_dependents': attempt to access non-boolean as boolean")
            dependents = param.bool_param
        await self.server.unload(request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()

    # -- client shared memory ----------------------------------------------------------------
    @property
    def _shm(self) -> Any:
        return self.server.shm

    @_rpc
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> pb.SystemSharedMemoryStatusResponse:
        return convert.shm_status("system", self._shm.status("system", request.name))

    @_rpc
    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> pb.SystemSharedMemoryRegisterResponse:
        body = {"key": request.key, "offset": request.offset, "byte_size": request.byte_size}
        await self._shm.register_system(request.name, body)
        return pb.SystemSharedMemoryRegisterResponse()

    @_rpc
    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> pb.SystemSharedMemoryUnregisterResponse:
        await self._shm.unregister("system", request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @_rpc
    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> pb.CudaSharedMemoryStatusResponse:
        return convert.shm_status("cuda", self._shm.status("cuda", request.name))

    @_rpc
    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> pb.CudaSharedMemoryRegisterResponse:
        import base64

        body = {
            "raw_handle": {"b64": base64.b64encode(request.raw_handle).decode()},
            "device_id": request.device_id,
            "byte_size": request.byte_size,
        }
        await self._shm.register_cuda(request.name, body)
        return pb.CudaSharedMemoryRegisterResponse()

    @_rpc
    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> pb.CudaSharedMemoryUnregisterResponse:
        await self._shm.unregister("cuda", request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- trace and logging extensions ----------------------------------------------------------
    @_rpc
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        current = self.server.trace_settings(request.model_name)  # an unknown model's error first
        if not request.settings:
            return convert.trace_response(current)
        return convert.trace_response(
            self.server.trace_settings(request.model_name, convert.trace_update(request.settings))
        )

    @_rpc
    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        update = convert.log_update(request.settings) if request.settings else None
        return convert.log_response(await self.server.logging(update))
