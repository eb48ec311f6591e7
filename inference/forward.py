"""A validated request onto the bus and its answers back: tensors into the store, output tensors out.

The inference core (`core.py`) wraps this with the response cache, classification and tracing."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import Any

from inference import streams
from inference.otel_trace import RequestTrace
from inference.sequence_params import sequence_params
from inference.shm import DISABLED, ShmRegistry
from inference.types import InputTensor, OutputTensor, ParsedRequest, RequestedOutput
from inference.validation import Validated
from shared.bus.dispatch import Dispatcher
from shared.bus.tensor_store import INLINE_BUDGET, TensorStore
from shared.config.model_config import ModelSpec
from shared.errors import Code, ShoalError, internal, invalid, unsupported
from shared.memory.segments import region_too_small, write_region
from shared.process.logcontext import request_ids
from shared.wire.messages import InferRequest, InferResponse, TensorRef

GATEWAY_PARAMETERS = frozenset({"binary_data_output", "priority", "timeout", "headers"})  # used up here


def _forwarded(parameters: dict[str, Any]) -> dict[str, Any]:
    """The request's parameters the model sees (the sequence ones stay: backends read them)."""
    return {k: v for k, v in parameters.items() if k not in GATEWAY_PARAMETERS} if parameters else {}


def _uint(parameters: dict[str, Any], key: str) -> int:
    if not parameters:
        return 0
    value = parameters.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise invalid(f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as unsigned-integer")
    return value


def _output_datatype(spec: ModelSpec, name: str) -> str:
    output = spec.output(name)
    if output is None:  # validation refused it already; a guard for the type checker and future callers
        raise invalid(f"unexpected inference output '{name}' for model '{spec.model_name}'")
    return output.datatype


def _regions_used(parsed: ParsedRequest) -> list[str]:
    tensors: list[InputTensor | RequestedOutput] = [*parsed.inputs, *(parsed.outputs or [])]
    return [str(t.parameters.get("shared_memory_region")) for t in tensors if t.in_shared_memory]


class Forwarder:
    def __init__(self, dispatcher: Dispatcher, store: TensorStore, timeout_s: float, shm: ShmRegistry | None) -> None:
        self.dispatcher = dispatcher
        self.store = store
        self.timeout_s = timeout_s
        self.shm = shm

    def _shm(self) -> ShmRegistry:
        if self.shm is None:  # BLS: a python model's tensors are never in a client's region
            raise unsupported(DISABLED)
        return self.shm

    async def infer(
        self,
        spec: ModelSpec,
        version: int,
        parsed: ParsedRequest,
        valid: Validated,
        trace: bool = False,
        timeout_s: float | None = None,
        span: RequestTrace | None = None,
    ) -> tuple[list[OutputTensor], dict[str, Any], InferResponse]:
        timeout_s = timeout_s or self.timeout_s
        used = _regions_used(parsed)
        if used:  # unregistering a region in use waits for its requests (see ShmRegistry.unregister)
            self._shm().hold(used)
        try:
            request, regions = self.prepare(spec, version, parsed, valid, trace, timeout_s, span)
            if span is not None:
                span.queued()
            try:
                response = await self.dispatcher.infer(request, timeout_s)
            finally:
                self.store.free(request.inputs)
            return await self.outputs(response, regions, valid, request.deadline_ns), response.parameters, response
        finally:
            if used:
                await self._shm().release(used)

    def stream(
        self,
        spec: ModelSpec,
        version: int,
        parsed: ParsedRequest,
        valid: Validated,
        timeout_s: float | None = None,
        empty_final: bool = False,
        span: RequestTrace | None = None,
    ) -> AsyncGenerator[tuple[list[OutputTensor], dict[str, Any], InferResponse] | ShoalError, None]:
        """A model's responses as they come (many for decoupled models); an error response is
        yielded as a `ShoalError`, and the stream goes on if the model said more will follow.
        `empty_final`: also yield the final flag that comes alone (gRPC streams can show it).
        The generator is `inference/streams.py`'s (mypyc compiles no async generator)."""
        return streams.responses(self, spec, version, parsed, valid, timeout_s or self.timeout_s, empty_final, span)

    def prepare(
        self,
        spec: ModelSpec,
        version: int,
        parsed: ParsedRequest,
        valid: Validated,
        trace: bool,
        timeout_s: float,
        span: RequestTrace | None = None,
    ) -> tuple[InferRequest, dict[str, TensorRef]]:
        """The bus request of a validated one, its inputs put in the tensor store (freed again if
        it cannot be built), and the client's shared-memory regions its outputs go to, by name."""
        now = time.time_ns()
        rid = self.dispatcher.new_rid()
        request_ids.set(f"{parsed.id}/{rid}" if parsed.id else rid)  # on every log line about this request
        inputs: list[TensorRef] = []
        sequence = sequence_params(parsed.parameters)
        try:
            budget = INLINE_BUDGET  # inline bytes per request, so requests group into bus messages
            for tensor in parsed.inputs:
                if tensor.data is None:  # in the client's shared memory
                    inputs.append(self._shm().reference(tensor.name, tensor.datatype, tensor.shape, tensor.parameters))
                    continue
                nbytes = memoryview(tensor.data).nbytes
                ref = self.store.put(
                    tensor.name, tensor.datatype, tensor.shape, tensor.data, timeout_s, inline=nbytes <= budget
                )
                budget -= nbytes if ref.data is not None else 0
                inputs.append(ref)
            regions = {
                o.name: self._shm().reference(o.name, _output_datatype(spec, o.name), [], o.parameters)
                for o in parsed.outputs or []
                if o.in_shared_memory
            }
            request = InferRequest(
                rid=rid,
                model=spec.name,
                version=version,
                reply=self.dispatcher.reply_subject(rid),
                deadline_ns=now + int(timeout_s * 1e9),
                batch_size=valid.batch_size,
                shape_sig=valid.shape_sig,
                id=parsed.id,
                inputs=inputs,
                outputs=valid.outputs,
                output_regions=regions,
                parameters=_forwarded(parsed.parameters),
                priority=_uint(parsed.parameters, "priority"),
                timeout_us=_uint(parsed.parameters, "timeout"),
                received_ns=now,
                trace=trace,
                traceparent=span.carrier[0] if span is not None else "",
                tracestate=span.carrier[1] if span is not None else "",
                sequence_id=sequence.sequence_id,
                sequence_start=sequence.start,
                sequence_end=sequence.end,
                route=parsed.route,
            )
        except BaseException:
            self.store.free(inputs)
            raise
        return request, regions

    async def outputs(
        self, response: InferResponse, regions: dict[str, TensorRef], valid: Validated, deadline: int
    ) -> list[OutputTensor]:
        """A response's output tensors (fetched from the store, or written into the client's
        region), or its error raised; the worker's copies released either way."""
        if response.error:
            await self.store.release_remote(response.outputs)
            raise ShoalError(response.error, Code(response.code) if response.code else Code.INTERNAL)
        try:
            return [await self._output(ref, regions.get(ref.name), valid, deadline) for ref in response.outputs]
        finally:
            await self.store.release_remote(response.outputs)

    async def _output(self, ref: TensorRef, region: TensorRef | None, valid: Validated, deadline: int) -> OutputTensor:
        if ref.in_region:
            return OutputTensor(ref.name, ref.datatype, ref.shape, None, False)
        data = await self.store.get(ref, max(0.1, (deadline - time.time_ns()) / 1e9))
        if region is not None and memoryview(data).nbytes > region.nbytes:
            raise region_too_small(ref.name, region, memoryview(data).nbytes)
        if region is not None:  # the worker could not reach the client's region: write it here
            if not write_region(region, data, self.store.host):
                raise internal(f"shared memory region of output '{ref.name}' is not reachable")
            return OutputTensor(ref.name, ref.datatype, ref.shape, None, False)
        return OutputTensor(ref.name, ref.datatype, ref.shape, data, valid.binary.get(ref.name, False))
