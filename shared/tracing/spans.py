"""The process's span exporter: the OpenTelemetry SDK over OTLP/HTTP, behind the `otel` extra.

`install` sets `active` once per process when `--trace-config mode=opentelemetry` is given; with
tracing off it stays None and every caller's check is one comparison (`spans.active is None`), so
a request that is not traced pays nothing else. Spans are timed with CLOCK_MONOTONIC nanoseconds
(the clock every service stamps events with) and exported on the wall clock of this host.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shared.tracing import context
from shared.tracing.trace_settings import SERVICE_NAME, OtelSettings, endpoint

log = logging.getLogger("shoal.tracing")

Span = Any  # an opentelemetry.trace.Span: the SDK is an optional import
Attributes = Mapping[str, str | int | float | bool]

active: Tracing | None = None


class Tracing:
    """Spans of this process: started as children of a W3C `traceparent` or of another span."""

    def __init__(self, settings: OtelSettings, service: str, instance: str, exporter: Any = None) -> None:
        try:
            from opentelemetry import trace
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.sampling import ALWAYS_ON
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            raise SystemExit(
                "--trace-config mode=opentelemetry needs the OpenTelemetry SDK: pip install 'shoal[otel]'"
            ) from None
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=endpoint(settings.url))
        # tritonserver's resource: service.name unless `resource=` sets it (OTEL_RESOURCE_ATTRIBUTES
        # below both, as in opentelemetry-cpp's Resource::Create); which Shoal service sent a span
        attributes: dict[str, str] = {
            "service.name": SERVICE_NAME,
            "service.instance.id": instance,
            "shoal.service": service,
        }
        attributes.update(settings.resource)
        queue = max(1, settings.bsp_max_queue_size)
        batch = min(max(1, settings.bsp_max_export_batch_size), queue)  # larger: opentelemetry-cpp drops the rest
        self._processor = BatchSpanProcessor(
            exporter,
            max_queue_size=queue,
            schedule_delay_millis=max(1, settings.bsp_schedule_delay),  # 0: at once (the SDK wants > 0)
            max_export_batch_size=batch,
        )
        # every span a sampled request asks for is recorded (tritonserver: AlwaysOnSampler), whatever
        # the sampled flag of the client's traceparent
        self._provider = TracerProvider(sampler=ALWAYS_ON, resource=Resource.create(attributes))
        self._provider.add_span_processor(self._processor)
        self._tracer = self._provider.get_tracer("shoal")
        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()

    # -- spans ---------------------------------------------------------------------------
    def start(
        self,
        name: str,
        parent: Span | tuple[str, str] | None,
        start_ns: int,
        attributes: Attributes | None = None,
        links: Iterable[tuple[str, str]] = (),
    ) -> Span:
        """A span begun at `start_ns` (CLOCK_MONOTONIC), child of a span of this process, of a
        (traceparent, tracestate) pair, or the root of a new trace (None)."""
        if parent is None or isinstance(parent, tuple):
            ctx = self._extract(parent) if parent else None
        else:
            ctx = self._trace.set_span_in_context(parent)
        return self._tracer.start_span(
            name,
            context=ctx,
            kind=self._trace.SpanKind.SERVER,
            attributes=attributes,
            links=[self._link(link) for link in links],
            start_time=wall_ns(start_ns),
        )

    def _extract(self, carrier: tuple[str, str]) -> Any:
        traceparent, tracestate = carrier
        return self._propagator.extract({"traceparent": traceparent, "tracestate": tracestate})

    def _link(self, carrier: tuple[str, str]) -> Any:
        span_context = self._trace.get_current_span(self._extract(carrier)).get_span_context()
        return self._trace.Link(span_context)

    @staticmethod
    def event(span: Span, name: str, ns: int) -> None:
        span.add_event(name, timestamp=wall_ns(ns))

    @staticmethod
    def end(span: Span, ns: int, error: str = "") -> None:
        if error:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=wall_ns(ns))

    @staticmethod
    def carrier(span: Span) -> tuple[str, str]:
        """(traceparent, tracestate) naming `span` as the parent of spans elsewhere."""
        ctx = span.get_span_context()
        ref = context.SpanRef(ctx.trace_id, ctx.span_id, int(ctx.trace_flags))
        return context.format(ref), ctx.trace_state.to_header() if ctx.trace_state else ""

    # -- life ----------------------------------------------------------------------------
    def flush(self, timeout_ms: int = 5000) -> bool:
        return bool(self._provider.force_flush(timeout_ms))

    def shutdown(self) -> None:
        self._provider.shutdown()


def wall_ns(monotonic_ns: int) -> int:
    """A CLOCK_MONOTONIC time as the wall-clock time OpenTelemetry wants (this host's clocks)."""
    return monotonic_ns + time.time_ns() - time.monotonic_ns()


def install(settings: OtelSettings | None, service: str, instance: str) -> Tracing | None:
    """Make `active` this process's exporter (None: tracing off). Called once by a service's `run`."""
    global active
    if settings is not None and active is None:
        active = Tracing(settings, service, instance)
        log.info("OpenTelemetry spans of this %s go to %s", service, endpoint(settings.url))
    return active


def uninstall() -> None:
    """Export what is left and stop (a service's last step)."""
    global active
    tracing, active = active, None
    if tracing is not None:
        tracing.shutdown()


def from_config(entries: Sequence[str]) -> OtelSettings | None:
    """The exporter's settings when `entries` (tritonserver's `--trace-config`) choose OpenTelemetry."""
    from shared.tracing import trace_settings

    return trace_settings.opentelemetry(entries) if trace_settings.mode(entries) == "opentelemetry" else None
