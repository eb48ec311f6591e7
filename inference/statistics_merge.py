"""Two scheduler replicas' statistics of the same model versions, merged (a model served by one,
then another, or a cluster of replicas): counts and durations add up, `last_inference` is the
later, batch sizes merge by size, first-response histogram counts add; what is a replica's view
rather than a count (latency quantiles, free credits, the cache switch) is the first replica's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import msgspec

from shared.wire.statistics import (
    BatchStats,
    Duration,
    InferenceStats,
    Latency,
    ModelStatistics,
    ResponseStats,
    SchedulerStatistics,
    StepStats,
    VersionStatistics,
)

K = TypeVar("K")
V = TypeVar("V")
Durations = TypeVar("Durations", InferenceStats, ResponseStats, StepStats)


def by_key(a: dict[K, V], b: dict[K, V], merge: Callable[[V, V], V]) -> dict[K, V]:
    """`a`'s keys in their order, then `b`'s others; a key in both is merged."""
    merged = dict(a)
    for key, value in b.items():
        merged[key] = merge(merged[key], value) if key in merged else value
    return merged


def _add(a: int, b: int) -> int:
    return a + b


def durations(a: Duration, b: Duration) -> Duration:
    return Duration(a.count + b.count, a.ns + b.ns)


def each_duration(a: Durations, b: Durations) -> Durations:
    """A Struct whose fields are all `Duration`s (inference, response and step stats): each adds."""
    return type(a)(*(durations(getattr(a, f), getattr(b, f)) for f in a.__struct_fields__))


def batch_stats(a: list[BatchStats], b: list[BatchStats]) -> list[BatchStats]:
    """By batch size, ascending."""
    sizes: dict[int, BatchStats] = {}
    for entry in a + b:
        same = sizes.get(entry.batch_size)
        sizes[entry.batch_size] = (
            entry
            if same is None
            else BatchStats(
                entry.batch_size,
                durations(same.compute_input, entry.compute_input),
                durations(same.compute_infer, entry.compute_infer),
                durations(same.compute_output, entry.compute_output),
            )
        )
    return [sizes[size] for size in sorted(sizes)]


def ensemble_steps(
    a: dict[str, StepStats] | msgspec.UnsetType, b: dict[str, StepStats] | msgspec.UnsetType
) -> dict[str, StepStats] | msgspec.UnsetType:
    if isinstance(a, msgspec.UnsetType):
        return b
    if isinstance(b, msgspec.UnsetType):
        return a
    return by_key(a, b, each_duration)


def model_statistics(a: ModelStatistics, b: ModelStatistics) -> ModelStatistics:
    return ModelStatistics(
        name=a.name or b.name,
        version=a.version or b.version,
        last_inference=max(a.last_inference, b.last_inference),
        inference_count=a.inference_count + b.inference_count,
        execution_count=a.execution_count + b.execution_count,
        inference_stats=each_duration(a.inference_stats, b.inference_stats),
        response_stats=by_key(a.response_stats, b.response_stats, each_duration),
        batch_stats=batch_stats(a.batch_stats, b.batch_stats),
        # not a count (Shoal reports none yet): the longer list, as the untyped merge did
        memory_usage=a.memory_usage if len(a.memory_usage) >= len(b.memory_usage) else b.memory_usage,
        ensemble_steps=ensemble_steps(a.ensemble_steps, b.ensemble_steps),
    )


def latency(a: Latency, b: Latency) -> Latency:
    """Histogram counts add (same buckets; else the longer list); quantiles cannot be added."""
    counts_a, counts_b = a.first_response_counts, b.first_response_counts
    if len(counts_a) == len(counts_b):
        counts = [x + y for x, y in zip(counts_a, counts_b)]
    else:
        counts = counts_a if len(counts_a) > len(counts_b) else counts_b
    return Latency(
        quantiles=a.quantiles or b.quantiles,
        first_response_buckets=a.first_response_buckets or b.first_response_buckets,
        first_response_counts=counts,
        first_response_sum_ms=a.first_response_sum_ms + b.first_response_sum_ms,
    )


def version_statistics(a: VersionStatistics, b: VersionStatistics) -> VersionStatistics:
    return VersionStatistics(
        stats=model_statistics(a.stats, b.stats),
        fail_reasons=by_key(a.fail_reasons, b.fail_reasons, _add),
        pending=a.pending + b.pending,
        free_credits=a.free_credits or b.free_credits,
        cache_enabled=a.cache_enabled or b.cache_enabled,
        latency=latency(a.latency, b.latency),
        worker_compute_ns=by_key(a.worker_compute_ns, b.worker_compute_ns, _add),
        worker_executions=by_key(a.worker_executions, b.worker_executions, _add),
        retries=a.retries + b.retries,
        oldest_wait_us=max(a.oldest_wait_us, b.oldest_wait_us),
        running_batches=a.running_batches + b.running_batches,
        busy_instances=max(a.busy_instances, b.busy_instances),
        instances=max(a.instances, b.instances),
    )


def scheduler_statistics(a: SchedulerStatistics, b: SchedulerStatistics) -> SchedulerStatistics:
    return SchedulerStatistics(by_key(a.versions, b.versions, version_statistics), max(a.replicas, b.replicas))
