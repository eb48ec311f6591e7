"""The streaming paths of the inference core and its forwarder, as async generators: a decoupled
model's responses, gRPC's streams, BLS's streaming calls.

They live apart from `core.py` and `forward.py` because mypyc compiles no async generator, and
those two modules are compiled (shoal/compiled_modules.py); `InferenceCore.stream` and `Forwarder.stream`
return these generators.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Protocol

from inference.types import Answer, OutputTensor, ParsedRequest, TraceFrom
from shared.errors import ShoalError
from shared.wire.messages import InferRequest, InferResponse, TensorRef

if TYPE_CHECKING:
    from inference.otel_trace import RequestTrace
    from inference.validation import Validated
    from shared.bus.dispatch import Dispatcher
    from shared.bus.tensor_store import TensorStore
    from shared.config.model_config import ModelSpec

Responses = AsyncGenerator[tuple[list[OutputTensor], dict[str, Any], InferResponse] | ShoalError, None]


# What the generators need of `core.InferenceCore` and `forward.Forwarder`: protocols, so that
# those two import this module and not the other way round (no import cycle).


class Forwarding(Protocol):
    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def store(self) -> TensorStore: ...

    def prepare(
        self,
        spec: ModelSpec,
        version: int,
        parsed: ParsedRequest,
        valid: Validated,
        trace: bool,
        timeout_s: float,
        span: RequestTrace | None = None,
    ) -> tuple[InferRequest, dict[str, TensorRef]]: ...

    async def outputs(
        self, response: InferResponse, regions: dict[str, TensorRef], valid: Validated, deadline: int
    ) -> list[OutputTensor]: ...

    def stream(
        self,
        spec: ModelSpec,
        version: int,
        parsed: ParsedRequest,
        valid: Validated,
        timeout_s: float | None = None,
        empty_final: bool = False,
        span: RequestTrace | None = None,
    ) -> Responses: ...


class Core(Protocol):
    @property
    def forwarder(self) -> Forwarding: ...

    def check(self, spec: ModelSpec, parsed: ParsedRequest, streaming: bool, endpoint: str) -> Validated: ...

    def span(
        self, spec: ModelSpec, version: int, parsed: ParsedRequest, started: int, trace: TraceFrom
    ) -> RequestTrace | None: ...

    def classify(self, spec: ModelSpec, parsed: ParsedRequest, outputs: list[OutputTensor]) -> list[OutputTensor]: ...


async def answers(
    core: Core,
    spec: ModelSpec,
    version: int,
    parsed: ParsedRequest,
    timeout_s: float | None,
    empty_final: bool,
    trace: TraceFrom | None,
    endpoint: str,
) -> AsyncGenerator[Answer | ShoalError, None]:
    """`InferenceCore.stream`: the request checked, traced when sampled, and each response
    classified; closing the iterator early cancels the request."""
    started = time.monotonic_ns()
    valid = core.check(spec, parsed, True, endpoint)
    span = core.span(spec, version, parsed, started, trace) if trace is not None else None
    stream = core.forwarder.stream(spec, version, parsed, valid, timeout_s, empty_final, span)
    error = "cancelled"
    try:
        async for item in stream:
            if isinstance(item, ShoalError):
                yield item
                continue
            outputs, parameters, response = item
            outputs = core.classify(spec, parsed, outputs)
            yield Answer(spec.model_name, version, parsed.id, outputs, parameters, final=not response.more)
        error = ""
    except ShoalError as exc:
        error = exc.message
        raise
    finally:
        if span is not None:
            span.end(error)
        await stream.aclose()


async def responses(
    forwarder: Forwarding,
    spec: ModelSpec,
    version: int,
    parsed: ParsedRequest,
    valid: Validated,
    timeout_s: float,
    empty_final: bool,
    span: RequestTrace | None,
) -> Responses:
    """`Forwarder.stream`: the request onto the bus, and its responses' outputs as they come."""
    request, regions = forwarder.prepare(spec, version, parsed, valid, False, timeout_s, span)
    if span is not None:
        span.queued()
    try:
        async for response in forwarder.dispatcher.stream(request, timeout_s):
            if response.empty and not response.error and not empty_final:
                continue  # the final flag alone: nothing to show
            try:
                outputs = await forwarder.outputs(response, regions, valid, request.deadline_ns)
            except ShoalError as exc:
                yield exc
                continue
            yield outputs, response.parameters, response
    finally:
        forwarder.store.free(request.inputs)
