"""The scheduler's statistics reply (`subjects.SCHEDULER_STATS`), typed end to end.

`ModelStatistics` is Triton's per-model-version statistics document (the statistics
extension's schema, docs/triton-spec.md §1.10): the field names and their order are the JSON
the extension answers, so a front end encodes the Struct as it is. `VersionStatistics` adds
what the gateway needs for `/metrics`; `SchedulerStatistics` is one replica's whole reply.
The scheduler fills it; the gateway merges every replica's (inference/statistics_merge.py) and
answers it, or an all-zero `ModelStatistics` for a version no scheduler has served yet.
"""

from __future__ import annotations

import msgspec


class Duration(msgspec.Struct):
    count: int = 0
    ns: int = 0


class InferenceStats(msgspec.Struct):
    success: Duration = msgspec.field(default_factory=Duration)
    fail: Duration = msgspec.field(default_factory=Duration)
    queue: Duration = msgspec.field(default_factory=Duration)
    compute_input: Duration = msgspec.field(default_factory=Duration)
    compute_infer: Duration = msgspec.field(default_factory=Duration)
    compute_output: Duration = msgspec.field(default_factory=Duration)
    cache_hit: Duration = msgspec.field(default_factory=Duration)
    cache_miss: Duration = msgspec.field(default_factory=Duration)


class ResponseStats(msgspec.Struct):
    """The n-th response across requests (Triton's response API; Shoal reports none yet)."""

    compute_infer: Duration = msgspec.field(default_factory=Duration)
    compute_output: Duration = msgspec.field(default_factory=Duration)
    success: Duration = msgspec.field(default_factory=Duration)
    fail: Duration = msgspec.field(default_factory=Duration)
    empty_response: Duration = msgspec.field(default_factory=Duration)
    cancel: Duration = msgspec.field(default_factory=Duration)


class BatchStats(msgspec.Struct):
    """Executions of one batch size: each sub-stat's `count` is their number (no top-level count)."""

    batch_size: int
    compute_input: Duration = msgspec.field(default_factory=Duration)
    compute_infer: Duration = msgspec.field(default_factory=Duration)
    compute_output: Duration = msgspec.field(default_factory=Duration)


class MemoryUsage(msgspec.Struct):
    type: str  # CPU, CPU_PINNED, GPU
    id: int
    byte_size: int


class StepStats(msgspec.Struct):
    """One composing model's steps as an ensemble saw them (Shoal's, docs/models.md)."""

    success: Duration = msgspec.field(default_factory=Duration)
    fail: Duration = msgspec.field(default_factory=Duration)


class ModelStatistics(msgspec.Struct):
    """One model version in Triton's schema; an entry built from a name and version is all-zero."""

    name: str
    version: str
    last_inference: int = 0  # ms since the epoch, 0: never
    inference_count: int = 0
    execution_count: int = 0
    inference_stats: InferenceStats = msgspec.field(default_factory=InferenceStats)
    response_stats: dict[str, ResponseStats] = {}  # response index ("0", "1", ...) -> its stats
    batch_stats: list[BatchStats] = []  # by batch size, ascending
    memory_usage: list[MemoryUsage] = []
    # Shoal's extra for an ensemble, member -> its steps; UNSET keeps it out of the JSON (Triton's
    # entries, and every non-ensemble's, have no such key)
    ensemble_steps: dict[str, StepStats] | msgspec.UnsetType = msgspec.UNSET


class Latency(msgspec.Struct):
    """The latency distributions behind `--metrics-config` (services/scheduler/statistics/latency.py)."""

    quantiles: dict[str, dict[str, float]] = {}  # kind -> quantile (as str(float)) -> microseconds
    first_response_buckets: list[float] = []  # upper bounds, ms
    first_response_counts: list[int] = []  # one more than the bounds: the last is +Inf
    first_response_sum_ms: float = 0.0


class VersionStatistics(msgspec.Struct):
    """What one scheduler reports of one model version: Triton's statistics and what `/metrics` adds."""

    stats: ModelStatistics
    fail_reasons: dict[str, int] = {}  # FailReason -> requests
    pending: int = 0  # requests not started yet
    free_credits: int = 0
    cache_enabled: bool = False
    latency: Latency = msgspec.field(default_factory=Latency)
    worker_compute_ns: dict[str, int] = {}  # worker -> ns its instances ran this model's batches
    worker_executions: dict[str, int] = {}  # worker -> batches
    retries: int = 0
    # the autoscaling signals (docs/scaling.md): a replica's view, merged by the largest
    oldest_wait_us: int = 0  # the longest-waiting request not started yet
    running_batches: int = 0  # batches in flight (running, or sent ahead to wait at their instance)
    busy_instances: int = 0  # instances holding a batch
    instances: int = 0  # instances known by a credit or a batch


class SchedulerStatistics(msgspec.Struct):
    """One scheduler replica's reply: "model/version" -> that version's statistics."""

    versions: dict[str, VersionStatistics]  # required: a reply of another shape must not read as "nothing served"
    replicas: int = 0  # the live scheduler replicas this one counts, itself included (0: cannot say)


class ReplicaCount(msgspec.Struct):
    """A view of a replica's reply (`SchedulerStatistics`, `UsageReply`): only how many replicas
    it counts, so a gatherer knows how many replies to wait for (`connection.gather`)."""

    replicas: int = 0
