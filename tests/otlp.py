"""An OTLP/HTTP trace receiver for tests: a small HTTP server on a free port that decodes each
`ExportTraceServiceRequest` (protobuf) with the official opentelemetry-proto definitions.

`OtlpReceiver.spans` is every span received so far, flattened with its resource's attributes;
`wait_for` waits, with a deadline, until a condition on them holds.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str  # hex, as OTLP/JSON writes it
    span_id: str
    parent_span_id: str  # "" for a root span
    start_ns: int
    end_ns: int
    events: list[tuple[str, int]]
    attributes: dict[str, Any]
    resource: dict[str, Any]
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace_id, span_id)
    status_code: int = 0

    @property
    def service(self) -> str:
        """Which Shoal service sent it (its resource's `shoal.service`)."""
        return str(self.resource.get("shoal.service", ""))

    @property
    def event_names(self) -> list[str]:
        return [name for name, _ in self.events]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


class OtlpReceiver:
    def __init__(self, port: int = 0) -> None:
        """`port` 0: a free one (tests); docs/serving.md's example listens on the OTLP/HTTP port, 4318."""
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.receive(body)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """As tritonserver's tests write it: host:port/path, no scheme."""
        return f"127.0.0.1:{self.port}/v1/traces"

    def receive(self, body: bytes) -> None:
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        received = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            events=[(e.name, e.time_unix_nano) for e in span.events],
                            attributes=_attributes(span.attributes),
                            resource=resource,
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                            status_code=span.status.code,
                        )
                    )
        with self._lock:
            self.spans.extend(received)
            self.requests += 1
            self._lock.notify_all()

    def clear(self) -> None:
        with self._lock:
            self.spans.clear()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, condition: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 30) -> list[ReceivedSpan]:
        """The spans once `condition` holds for them (checked at each export that arrives)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not condition(list(self.spans)):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted((s.service, s.name) for s in self.spans)
                    raise AssertionError(f"the spans received in {timeout_s}s do not hold: {names}")
                self._lock.wait(left)
            return list(self.spans)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
