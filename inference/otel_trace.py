"""A sampled request's spans where it enters Shoal (opentelemetry trace mode).

Triton's shape (src/tracer.cc): a root span `InferRequest` (the client's span as its parent when
the request brings a W3C `traceparent`) and, under it, the model's span named for the model with
its REQUEST_START, QUEUE_START and REQUEST_END events and `triton.*` attributes. A BLS call has no
root span: its model span is a child of the calling request's model span. The model span's context
travels with the request (`InferRequest.traceparent`), and the scheduler and the worker hang their
spans under it in their own processes (docs/serving.md, "Tracing").
"""

from __future__ import annotations

import time

from shared.tracing.spans import Span, Tracing

Carrier = tuple[str, str]  # (traceparent, tracestate)


class RequestTrace:
    """The gateway's spans of one request: begun at REQUEST_START, ended with its answer."""

    def __init__(
        self,
        tracing: Tracing,
        model: str,
        version: int,
        request_id: str,
        started_ns: int,
        parent: Carrier | None,
        protocol: str = "",
        root: bool = True,
    ) -> None:
        self.tracing = tracing
        self.protocol = protocol
        self.root: Span | None = None
        if root:
            self.root = tracing.start("InferRequest", parent, started_ns)
            if protocol:  # the request was read whole when the core got it
                tracing.event(self.root, _received(protocol), started_ns)
        attributes: dict[str, str | int] = {"triton.model_name": model, "triton.model_version": version}
        if request_id:
            attributes["triton.request_id"] = request_id
        self.model = tracing.start(model, self.root if root else parent, started_ns, attributes)
        tracing.event(self.model, "REQUEST_START", started_ns)
        self.carrier = tracing.carrier(self.model)

    def queued(self) -> None:
        """QUEUE_START: the request left for its scheduler's queue (which records its own arrival)."""
        self.tracing.event(self.model, "QUEUE_START", time.monotonic_ns())

    def end(self, error: str = "") -> None:
        now = time.monotonic_ns()
        self.tracing.event(self.model, "REQUEST_END", now)
        self.tracing.end(self.model, now, error)
        if self.root is not None:
            self.tracing.event(self.root, "INFER_RESPONSE_COMPLETE", now)
            self.tracing.end(self.root, now, error)


def _received(protocol: str) -> str:
    return "GRPC_WAITREAD_END" if protocol == "GRPC" else f"{protocol}_RECV_END"
