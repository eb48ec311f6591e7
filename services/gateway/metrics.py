"""`/metrics` on the metrics port with Triton's metric names and labels (triton-spec §4).

Counters live in the scheduler (where requests are queued and completed); each scrape
asks it and renders them. The text is written here rather than by prometheus-client
because Triton's counters have no `_total` suffix in `# HELP`/`# TYPE` or samples
(prometheus-cpp's exposition), and Grafana dashboards built for Triton query those
exact names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

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


def _labels(labels: dict[str, str]) -> str:
    escaped = (f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in labels.items())
    return "{" + ",".join(escaped) + "}"


def _family(name: str, doc: str, kind: str, samples: list[tuple[dict[str, str], float]]) -> list[str]:
    lines = [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{_labels(labels)} {value:g}" for labels, value in samples]
    return lines


def render(stats: dict[str, Any]) -> bytes:
    entries = [(key.rsplit("/", 1), value) for key, value in sorted(stats.items())]
    lines: list[str] = []
    for name, doc, pick in _COUNTERS:
        samples = [({"model": m, "version": v}, pick(value["stats"])) for (m, v), value in entries]
        lines += _family(name, doc, "counter", samples)
    failures = [
        ({"model": m, "reason": reason, "version": v}, value.get("fail_reasons", {}).get(reason, 0))
        for (m, v), value in entries
        for reason in FAILURE_REASONS
    ]
    lines += _family("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
                     "counter", failures)
    pending = [({"model": m, "version": v}, value.get("pending", 0)) for (m, v), value in entries]
    lines += _family("nv_inference_pending_request_count",
                     "Instantaneous number of pending requests awaiting execution per-model.", "gauge", pending)
    return ("\n".join(lines) + "\n").encode()


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
