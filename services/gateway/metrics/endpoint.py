"""`/metrics` on the metrics port with Triton's metric names and labels (docs/triton-spec.md §4).

Counters live in the scheduler (where requests are queued and completed); each scrape
asks it and renders them. The text is written here rather than by prometheus-client
because Triton's counters have no `_total` suffix in `# HELP`/`# TYPE` or samples
(prometheus-cpp's exposition), and Grafana dashboards built for Triton query those
exact names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.gateway.metrics import model_management
from services.gateway.metrics import system as system_metrics
from services.gateway.metrics.gpu import GpuMetrics
from services.gateway.metrics.prometheus_text import double_text, family_lines, histogram_lines, label_text
from services.gateway.metrics.system import CpuSampler
from shared.wire.control import ModelFigures
from shared.wire.statistics import Duration, InferenceStats, ModelStatistics, SchedulerStatistics, VersionStatistics

Entries = list[tuple[tuple[str, str], VersionStatistics]]  # (model, version) -> its statistics

_COUNTERS: tuple[tuple[str, str, Callable[[ModelStatistics], float]], ...] = (
    (
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        lambda s: s.inference_stats.success.count,
    ),
    (
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        lambda s: s.inference_count,
    ),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        lambda s: s.execution_count,
    ),
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        lambda s: (s.inference_stats.success.ns + s.inference_stats.fail.ns) // 1000,
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        lambda s: s.inference_stats.queue.ns // 1000,
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        lambda s: s.inference_stats.compute_input.ns // 1000,
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        lambda s: s.inference_stats.compute_infer.ns // 1000,
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        lambda s: s.inference_stats.compute_output.ns // 1000,
    ),
)
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
LOAD_TIME = "nv_model_load_duration_secs"


@dataclass(frozen=True)
class MetricsOptions:
    """tritonserver's --metrics-config keys, and --allow-cpu-metrics."""

    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    quantiles: tuple[tuple[float, float], ...] = (
        (0.5, 0.05),
        (0.9, 0.01),
        (0.95, 0.001),
        (0.99, 0.001),
        (0.999, 0.001),
    )
    cpu_metrics: bool = True
    gpu_metrics: bool = True


_SUMMARIES = (
    (
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds (includes cached requests)",
        "request",
    ),
    (
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds (includes cached requests)",
        "queue",
    ),
    (
        "nv_inference_compute_input_summary_us",
        "Summary of compute input duration in microseconds (does not include cached requests)",
        "compute_input",
    ),
    (
        "nv_inference_compute_infer_summary_us",
        "Summary of compute inference duration in microseconds (does not include cached requests)",
        "compute_infer",
    ),
    (
        "nv_inference_compute_output_summary_us",
        "Summary of inference compute output duration in microseconds (does not include cached requests)",
        "compute_output",
    ),
)
_SUMMARY_TOTALS: dict[str, Callable[[InferenceStats], Duration]] = {  # a summary's _sum and _count
    "request": lambda s: s.success,
    "queue": lambda s: s.queue,
    "compute_input": lambda s: s.compute_input,
    "compute_infer": lambda s: s.compute_infer,
    "compute_output": lambda s: s.compute_output,
}
# the response cache's counters; each value a float, so written with `g` as it always was
_CACHE: tuple[tuple[str, str, Callable[[InferenceStats], float]], ...] = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", lambda s: float(s.cache_hit.count)),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", lambda s: float(s.cache_miss.count)),
    (
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds",
        lambda s: s.cache_hit.ns / 1000,
    ),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert+lookup) duration per model, in microseconds",
        lambda s: s.cache_miss.ns / 1000,
    ),
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def quantile_label(q: float) -> str:
    """A quantile as prometheus-cpp writes its label (Triton's metrics): a double at 16 significant
    digits, the shortest form (0.5, 0.999, 1e-05)."""
    return f"{q:.16g}"


def _summaries(entries: Entries, options: MetricsOptions) -> list[str]:
    lines: list[str] = []
    for name, doc, kind in _SUMMARIES:
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} summary"]
        for (model, version), value in entries:
            labels = {"model": model, "version": version}
            points = value.latency.quantiles.get(kind, {})
            for q, _error in options.quantiles:  # every quantile asked for, NaN before any observation
                value_text = f"{points[str(q)]:g}" if str(q) in points else "NaN"
                lines.append(f"{name}{label_text({**labels, 'quantile': quantile_label(q)})} {value_text}")
            total = _SUMMARY_TOTALS[kind](value.stats.inference_stats)
            lines.append(f"{name}_sum{label_text(labels)} {total.ns / 1000:g}")
            lines.append(f"{name}_count{label_text(labels)} {total.count}")
    return lines


def _batch_histogram(entries: Entries) -> list[str]:
    rows: list[tuple[dict[str, str], list[int], list[int], float]] = []
    for (model, version), value in entries:
        sizes = {b.batch_size: b.compute_infer.count for b in value.stats.batch_stats}
        counts = [0] * (len(BATCH_BUCKETS) + 1)
        for size, count in sizes.items():
            index = next((i for i, bound in enumerate(BATCH_BUCKETS) if size <= bound), len(BATCH_BUCKETS))
            counts[index] += count
        total = sum(size * count for size, count in sizes.items())
        rows.append(({"model": model, "version": version}, list(BATCH_BUCKETS), counts, total))
    return histogram_lines("shoal_batch_size", "Sizes of the batches executed (rows per model execution)", rows)


def _shoal_gauges(entries: Entries) -> list[str]:
    lines = family_lines(
        "shoal_queue_free_credits",
        "Batches the scheduler may send to idle instances now",
        "gauge",
        [({"model": m, "version": v}, value.free_credits) for (m, v), value in entries],
    )
    lines += _scaling_gauges(entries)
    busy: dict[str, int] = {}
    executions: dict[tuple[str, str, str], int] = {}
    for (model, version), value in entries:
        for worker, ns in value.worker_compute_ns.items():
            busy[worker] = busy.get(worker, 0) + ns
        for worker, count in value.worker_executions.items():
            executions[(worker, model, version)] = count
    lines += family_lines(
        "shoal_worker_compute_seconds",
        "Seconds the instances of a worker spent running batches "
        "(its utilisation is the rate of this counter over its instance count)",
        "counter",
        [({"worker": w}, ns / 1e9) for w, ns in sorted(busy.items())],
    )
    lines += family_lines(
        "shoal_worker_executions",
        "Model executions (batches) each worker ran, per model",
        "counter",
        [({"worker": w, "model": m, "version": v}, n) for (w, m, v), n in sorted(executions.items())],
    )
    lines += family_lines(
        "shoal_inference_request_retry",
        "Requests sent to another instance because the worker holding them died before starting them",
        "counter",
        [({"model": m, "version": v}, value.retries) for (m, v), value in entries],
    )
    lines += family_lines(
        "shoal_shm_bytes_in_use",
        "Bytes of tensors in Shoal's shared-memory segments on this host",
        "gauge",
        [({}, system_metrics.shm_bytes_in_use())],
    )
    return lines


def _scaling_gauges(entries: Entries) -> list[str]:
    """The autoscaling signals beside Triton's `nv_inference_pending_request_count` (docs/scaling.md):
    what KEDA's Prometheus trigger, an HPA on external metrics and `shoal autoscale` read."""
    labels = [({"model": m, "version": v}, value) for (m, v), value in entries]
    return [
        *family_lines(
            "shoal_queue_oldest_wait_seconds",
            "Seconds the longest-waiting request not started yet has waited, per model",
            "gauge",
            [(label, value.oldest_wait_us / 1e6) for label, value in labels],
        ),
        *family_lines(
            "shoal_inflight_batches",
            "Batches in flight per model: running, or sent ahead to wait at their instance",
            "gauge",
            [(label, value.running_batches) for label, value in labels],
        ),
        *family_lines(
            "shoal_instance_utilization",
            "Share of the model's instances holding a batch now [0.0 - 1.0]",
            "gauge",
            [(label, value.busy_instances / value.instances if value.instances else 0.0) for label, value in labels],
        ),
        *family_lines(
            "shoal_model_instances",
            "Instances of the model the schedulers know (by a free credit or a batch)",
            "gauge",
            [(label, value.instances) for label, value in labels],
        ),
    ]


def resent_lines(resent: Mapping[tuple[str, str], int]) -> list[str]:
    """This gateway's requests sent again (shared/bus/dispatch.py), by model and why: `scheduler_lost`
    (the scheduler holding them died), `bus_reconnect` (the gateway's NATS connection dropped),
    `no_scheduler` (no scheduler served the model yet: sent until one did or the wait ended);
    shown once there is one (a labelled counter has no sample before its first event)."""
    if not resent:
        return []
    return family_lines(
        "shoal_inference_request_resent",
        "Requests this gateway sent again because their scheduler died, none served their model yet, or its NATS connection dropped",
        "counter",
        [({"model": m, "reason": why}, n) for (m, why), n in sorted(resent.items())],
    )


def _gpu(gpu: GpuMetrics) -> list[str]:
    lines: list[str] = []
    families: dict[str, tuple[str, str, list[tuple[Mapping[str, str], float]]]] = {}
    for name, doc, kind, labels, value in gpu.read():
        families.setdefault(name, (doc, kind, []))[2].append((labels, value))
    for name, (doc, kind, samples) in families.items():
        lines += family_lines(name, doc, kind, samples)
    return lines


def _counters(entries: Entries, options: MetricsOptions) -> list[str]:
    lines: list[str] = []
    for name, doc, pick in _COUNTERS:
        if not options.counter_latencies and name.endswith("_duration_us"):
            continue
        samples = [({"model": m, "version": v}, pick(value.stats)) for (m, v), value in entries]
        lines += family_lines(name, doc, "counter", samples)
    failures = [
        ({"model": m, "reason": reason, "version": v}, value.fail_reasons.get(reason, 0))
        for (m, v), value in entries
        for reason in FAILURE_REASONS
    ]
    lines += family_lines(
        "nv_inference_request_failure", "Number of failed inference requests, all batch sizes", "counter", failures
    )
    pending = [({"model": m, "version": v}, value.pending) for (m, v), value in entries]
    return lines + family_lines(
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model.",
        "gauge",
        pending,
    )


def _first_response_histogram(entries: Entries) -> list[str]:
    """Every model's (ensembles' too), in the buckets its `model_metrics` gives, else Triton's."""
    if not entries:
        return []  # prometheus-cpp leaves out a family with no metric
    rows = [
        (
            {"model": m, "version": v},
            value.latency.first_response_buckets,
            value.latency.first_response_counts,
            value.latency.first_response_sum_ms,
        )
        for (m, v), value in entries
    ]
    return histogram_lines(
        "nv_inference_first_response_histogram_ms", "Duration from request to first response in milliseconds", rows
    )


def _load_times(figures: ModelFigures | None) -> list[str]:
    """Each loaded version's load time (Triton's gauge); a version no longer loaded has none."""
    if figures is None or not figures.load_times:
        return []  # prometheus-cpp leaves out a family with no metric
    samples = [({"model": t.model, "version": str(t.version)}, t.seconds) for t in figures.load_times]
    lines = [f"# HELP {LOAD_TIME} Model load time in seconds", f"# TYPE {LOAD_TIME} gauge"]
    return lines + [f"{LOAD_TIME}{label_text(labels)} {double_text(value)}" for labels, value in samples]


def _cpu(cpu: CpuSampler) -> list[str]:
    total, used = system_metrics.memory()
    return [
        *family_lines("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "gauge", [({}, cpu.utilization())]),
        *family_lines("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", "gauge", [({}, total)]),
        *family_lines("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", "gauge", [({}, used)]),
    ]


def _cache(entries: Entries) -> list[str]:
    """The response cache's counters, for the models that use it (none: no family at all)."""
    cached = [(m, v, value) for (m, v), value in entries if value.cache_enabled]
    lines: list[str] = []
    for name, doc, cache_pick in _CACHE if cached else ():
        samples = [({"model": m, "version": v}, cache_pick(value.stats.inference_stats)) for m, v, value in cached]
        lines += family_lines(name, doc, "counter", samples)
    return lines


def render(
    versions: Mapping[str, VersionStatistics],
    options: MetricsOptions = MetricsOptions(),
    cpu: CpuSampler | None = None,
    gpu: GpuMetrics | None = None,
    custom: list[str] | None = None,
    figures: ModelFigures | None = None,
) -> bytes:
    """Triton's metrics from the schedulers' statistics (and the repository's `figures`: load
    times), then Shoal's, then python models' own (`custom`), each family in the order Triton's
    `/metrics` shows it."""
    ordered = (versions[key] for key in sorted(versions))  # by "model/version", as always
    entries = [((value.stats.name, value.stats.version), value) for value in ordered]
    lines = _counters(entries, options)
    lines += _load_times(figures)
    if options.summary_latencies:
        lines += _summaries(entries, options)
    if options.histogram_latencies:
        lines += _first_response_histogram(entries)
    if options.cpu_metrics and cpu is not None:
        lines += _cpu(cpu)
    lines += _cache(entries)
    if options.gpu_metrics and gpu is not None:
        lines += _gpu(gpu)
    lines += _batch_histogram(entries)
    lines += _shoal_gauges(entries)
    lines += model_management.render(figures)
    lines += custom or []
    return ("\n".join(lines) + "\n").encode()


async def _nothing() -> list[str]:
    return []


async def _no_figures() -> ModelFigures | None:
    return None


def build_metrics_app(
    fetch: Callable[[list[float]], Awaitable[SchedulerStatistics]],
    options: MetricsOptions,
    fetch_custom: Callable[[], Awaitable[list[str]]] | None = None,
    fetch_figures: Callable[[], Awaitable[ModelFigures | None]] = _no_figures,
) -> Starlette:
    """`fetch`: the schedulers' statistics; `fetch_figures`: the repository's (load times, model
    management); `fetch_custom`: lines of Shoal's own and python models' metrics."""
    cpu = CpuSampler()
    gpu = GpuMetrics() if options.gpu_metrics else None

    async def metrics(request: Request) -> Response:
        if request.method != "GET":
            return Response(status_code=405)
        if request.url.path.rstrip("/") != "/metrics":
            return Response(status_code=200)  # Triton's quirk: any other GET path is 200, empty
        quantiles = [q for q, _ in options.quantiles] if options.summary_latencies else []
        stats, figures, custom = await asyncio.gather(
            fetch(quantiles), fetch_figures(), fetch_custom() if fetch_custom else _nothing(), return_exceptions=True
        )
        versions = {} if isinstance(stats, BaseException) else stats.versions
        figures = None if isinstance(figures, BaseException) else figures
        custom = [] if isinstance(custom, BaseException) else custom
        text = render(versions, options, cpu, gpu, custom, figures)
        return Response(text, media_type="text/plain; charset=utf-8")

    return Starlette(routes=[Route("/{path:path}", metrics, methods=["GET", "POST", "PUT", "DELETE"])])
