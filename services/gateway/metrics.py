"""`/metrics` on the metrics port with Triton's metric names and labels (triton-spec §4).

Counters live in the scheduler (where requests are queued and completed); each scrape
asks it and renders them with prometheus-client. Counter samples carry no `_total`
suffix, as Triton's prometheus-cpp exposition prints them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s["inference_stats"]["success"]["count"]),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda s: s["inference_count"]),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     lambda s: s["execution_count"]),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda s: (s["inference_stats"]["success"]["ns"] + s["inference_stats"]["fail"]["ns"]) // 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds (includes cached requests)",
     lambda s: s["inference_stats"]["queue"]["ns"] // 1000),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds (does not include cached requests)",
     lambda s: s["inference_stats"]["compute_input"]["ns"] // 1000),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds (does not include cached requests)",
     lambda s: s["inference_stats"]["compute_infer"]["ns"] // 1000),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     lambda s: s["inference_stats"]["compute_output"]["ns"] // 1000),
)
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


class _Snapshot:
    """A collector over one scrape's scheduler statistics."""

    def __init__(self, stats: dict[str, Any]) -> None:
        self.stats = stats

    def collect(self):
        entries = [(key.rsplit("/", 1), value) for key, value in sorted(self.stats.items())]
        for name, doc, pick in _COUNTERS:
            metric = Metric(name, doc, "counter")
            for (model, version), value in entries:
                metric.add_sample(name, {"model": model, "version": version}, pick(value["stats"]))
            yield metric
        failure = Metric("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", "counter")
        for (model, version), value in entries:
            for reason in FAILURE_REASONS:
                count = value.get("fail_reasons", {}).get(reason, 0)
                failure.add_sample(failure.name, {"model": model, "reason": reason, "version": version}, count)
        yield failure
        pending = Metric("nv_inference_pending_request_count",
                         "Instantaneous number of pending requests awaiting execution per-model.", "gauge")
        for (model, version), value in entries:
            pending.add_sample(pending.name, {"model": model, "version": version}, value.get("pending", 0))
        yield pending


def render(stats: dict[str, Any]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(stats))
    return generate_latest(registry)


def build_metrics_app(fetch: Callable[[], Awaitable[dict[str, Any]]]) -> Starlette:
    async def metrics(request: Request) -> Response:
        if request.method != "GET":
            return Response(status_code=405)
        if request.url.path.rstrip("/") != "/metrics":
            return Response(status_code=200)  # Triton's quirk: any other GET path is 200, empty
        try:
            stats = await fetch()
        except Exception:
            stats = {}
        return Response(render(stats), media_type="text/plain; charset=utf-8")

    return Starlette(routes=[Route("/{path:path}", metrics, methods=["GET", "POST", "PUT", "DELETE"])])
