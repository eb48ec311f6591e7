"""The inference core every transport calls (HTTP, gRPC, BLS): a parsed request in, an answer out.

Validation, the response cache (lookup, insert, and the hit/miss event the scheduler counts),
tracing and the classification extension happen here once; a transport only decodes its
wire format into a `ParsedRequest` and encodes the `Answer` it gets back.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable

from inference import classification, streams
from inference.cache import Cache, cache_key
from inference.forward import Forwarder
from inference.models import ModelRegistry
from inference.on_demand import DemandLoads
from inference.otel_trace import RequestTrace
from inference.shm import DISABLED, ShmRegistry
from inference.trace import TracedTensor, Tracer
from inference.types import Answer, OutputTensor, ParsedRequest, TraceFrom
from inference.validation import Validated, validate
from shared.bus.dispatch import Dispatcher
from shared.bus.tensor_store import TensorStore
from shared.config.model_config import ModelSpec
from shared.errors import ShoalError, unsupported
from shared.tracing import context, spans
from shared.wire.messages import CacheEvent

# a request that failed with one of these never ran: its model left (evicted) between this gateway's
# look-up and the scheduler, which failed it from its queue or had stopped serving the model
NEVER_RAN = ("was unloaded", "no scheduler is serving requests")
HTTP_ENDPOINT = "HTTP end point"  # how Triton names the transport that refuses a decoupled model

CacheEvents = Callable[[CacheEvent], Awaitable[None]]


def trace_from(protocol: str, traceparent: str | None, tracestate: str | None) -> TraceFrom:
    return TraceFrom(protocol, (traceparent, tracestate or "") if traceparent else None)


def _traced_tensors(parsed: ParsedRequest, outputs: list[OutputTensor]) -> list[tuple[str, TracedTensor]]:
    """The tensors of a TENSORS trace: the inputs as they were queued, the outputs as they came back."""
    return [
        *(("TENSOR_QUEUE_INPUT", TracedTensor(t.name, t.datatype, t.shape, t.data)) for t in parsed.inputs),
        *(("TENSOR_BACKEND_OUTPUT", TracedTensor(o.name, o.datatype, o.shape, o.data)) for o in outputs),
    ]


class InferenceCore:
    def __init__(
        self,
        registry: ModelRegistry,
        dispatcher: Dispatcher,
        store: TensorStore,
        timeout_s: float,
        shm: ShmRegistry | None = None,
        cache: Cache | None = None,
        tracer: Tracer | None = None,
        cache_events: CacheEvents | None = None,
        demand: DemandLoads | None = None,
    ) -> None:
        self.registry = registry
        self.demand = demand
        self.shm = shm
        self.cache = cache
        self.tracer = tracer
        self.cache_events = cache_events
        self.forwarder = Forwarder(dispatcher, store, timeout_s, shm)

    def resolve(self, model: str, version: str = "") -> tuple[ModelSpec, int]:
        """The model and version a request goes to, or Triton's error for why not."""
        return self.registry.resolve(model, version)

    async def resolve_late(self, model: str, version: str, missing: ShoalError) -> tuple[ModelSpec, int]:
        """A model `resolve` refused (`missing`): resolved once this gateway's view of the models
        has caught up with the bucket, else why not. Another process (a PyTriton script, a python
        model, another gateway's client) may have loaded it a moment ago, and this view is a KV
        watch that delivers its record a moment later (`ModelRegistry.caught_up`)."""
        if await self.registry.caught_up():
            return self.registry.resolve(model, version)
        raise missing

    async def load_on_demand(
        self, model: str, version: str, missing: ShoalError, timeout_s: float | None = None
    ) -> tuple[ModelSpec, int]:
        """A model `resolve` refused (`missing`): `resolve_late`'s, loaded now when it loads on
        demand, else `missing`."""
        try:
            return await self.resolve_late(model, version, missing)
        except ShoalError as still:
            missing = still
        if self.demand is None:
            raise missing
        return await self.demand.resolve(model, version, missing, timeout_s)

    @property
    def spans(self) -> bool:
        """Whether requests get OpenTelemetry spans here: the transports then read the W3C
        context of each request (`trace_from`); with tracing off they read nothing."""
        return self.tracer is not None and self.tracer.tracing is not None

    def loads_on_demand(self, model: str) -> bool:
        return self.demand is not None and self.demand.loads(model)

    def check(self, spec: ModelSpec, parsed: ParsedRequest, streaming: bool, endpoint: str) -> Validated:
        in_shm = any(t.in_shared_memory for t in parsed.inputs + (parsed.outputs or []))
        if in_shm and (self.shm is None or not self.shm.enabled):
            raise unsupported(DISABLED)
        return validate(spec, parsed, streaming=streaming, endpoint=endpoint)

    async def infer(
        self,
        spec: ModelSpec,
        version: int,
        parsed: ParsedRequest,
        *,
        endpoint: str = HTTP_ENDPOINT,
        timeout_s: float | None = None,
        started_ns: int | None = None,
        trace: TraceFrom | None = None,
    ) -> Answer:
        """One request, one response (a decoupled model is refused: `endpoint` names who refuses).
        `trace`: where the request came from and the OpenTelemetry context it brought, if any."""
        started = started_ns or time.monotonic_ns()
        valid = self.check(spec, parsed, False, endpoint)
        key = cache_key(spec.name, version, parsed, valid) if self.cache is not None and spec.response_cache else None
        cached = await self.cache.get(key) if self.cache is not None and key is not None else None
        if cached is not None:
            outputs = [
                OutputTensor(o.name, o.datatype, o.shape, o.data, valid.binary.get(o.name, False)) for o in cached
            ]
            await self._cache_event(spec.name, version, True, time.monotonic_ns() - started)
            return Answer(spec.model_name, version, parsed.id, self.classify(spec, parsed, outputs))
        traced, span = False, None
        if self.tracer is not None and self.tracer.tracing is None:
            traced = self.tracer.sample(spec.name)
        elif trace is not None:  # opentelemetry mode, or a BLS call of a traced request
            span = self.span(spec, version, parsed, started, trace)
        try:
            try:
                outputs, parameters, response = await self.forwarder.infer(
                    spec, version, parsed, valid, traced, timeout_s, span
                )
            except ShoalError as refused:
                if not (self.loads_on_demand(spec.name) and any(text in refused.message for text in NEVER_RAN)):
                    raise  # else: load it again and send it once more
                spec, version = await self.load_on_demand(spec.name, str(version), refused, timeout_s)
                outputs, parameters, response = await self.forwarder.infer(
                    spec, version, parsed, valid, traced, timeout_s, span
                )
        except BaseException as exc:
            if span is not None:
                span.end(exc.message if isinstance(exc, ShoalError) else type(exc).__name__)
            raise
        if self.cache is not None and key is not None:
            inserted = time.monotonic_ns()
            await self.cache.put(key, outputs)
            await self._cache_event(spec.name, version, False, time.monotonic_ns() - inserted)
        answer = Answer(spec.model_name, version, parsed.id, self.classify(spec, parsed, outputs), parameters)
        if span is not None:
            span.end()
        elif traced and self.tracer is not None:
            timestamps = {"REQUEST_START": started, **response.trace, "REQUEST_END": time.monotonic_ns()}
            tensors = _traced_tensors(parsed, outputs) if self.tracer.tensors_traced(spec.name) else []
            self.tracer.record(spec.name, version, parsed.id, timestamps, response.batch, tensors)
        return answer

    def span(
        self, spec: ModelSpec, version: int, parsed: ParsedRequest, started: int, trace: TraceFrom
    ) -> RequestTrace | None:
        """The request's spans when it is traced: sampled at this gateway (a context the client
        brought is always traced, as in Triton), or a BLS call whose caller passed its trace."""
        if not trace.protocol:  # BLS: no sampling of its own, under the calling request's span
            tracing = spans.active
            if tracing is None or trace.parent is None:
                return None
            return RequestTrace(tracing, spec.name, version, parsed.id, started, trace.parent, root=False)
        tracer = self.tracer
        if tracer is None or tracer.tracing is None:
            return None
        parent = trace.parent if trace.parent is not None and context.parse(trace.parent[0]) else None
        if not tracer.sample(spec.name, forced=parent is not None):
            return None
        return RequestTrace(tracer.tracing, spec.name, version, parsed.id, started, parent, trace.protocol)

    def stream(
        self,
        spec: ModelSpec,
        version: int,
        parsed: ParsedRequest,
        *,
        timeout_s: float | None = None,
        empty_final: bool = False,
        trace: TraceFrom | None = None,
    ) -> AsyncGenerator[Answer | ShoalError, None]:
        """A model's responses as they come (many for a decoupled model). An error response is
        yielded as a `ShoalError` and the stream goes on if the model said more will follow;
        closing the iterator early cancels the request (it leaves its queue). The generator is
        `inference/streams.py`'s (mypyc compiles no async generator; this module it compiles)."""
        return streams.answers(self, spec, version, parsed, timeout_s, empty_final, trace, HTTP_ENDPOINT)

    def classify(self, spec: ModelSpec, parsed: ParsedRequest, outputs: list[OutputTensor]) -> list[OutputTensor]:
        """The classification extension: requested outputs replaced by their top classes, labelled
        from the outputs' label files."""
        classify = {o.name: o.classification for o in parsed.outputs or [] if o.classification}
        if not classify:
            return outputs
        batching = spec.max_batch_size > 0
        return [
            classification.classify(o, classify[o.name], batching, self.registry.labels(spec.name, o.name))
            if o.name in classify
            else o
            for o in outputs
        ]

    async def _cache_event(self, model: str, version: int, hit: bool, ns: int) -> None:
        if self.cache_events is not None:
            await self.cache_events(CacheEvent(model, version, hit, ns, ns if hit else 0))
