"""The control plane's messages: model load, unload and on-demand requests and their answers,
the repository index, the figures on-demand eviction and /metrics gather, drains, custom metrics
and the logging settings. A Struct whose docstring says "as JSON" travels as JSON (these are
slow-path requests and replies that `nats req` can read and send); the others as MessagePack,
like every message on the request path (shared/wire/messages.py)."""

from __future__ import annotations

from typing import Any

import msgspec

from shared.wire.records import ModelState


class DrainRequest(msgspec.Struct):
    """Repository -> schedulers: answer once nothing is queued or running for this version, or
    after `timeout_s` (`DrainDone`). `holder`: the replica whose lease the repository read, which
    answers even if the lease moved meanwhile; empty: the model's current owner answers."""

    model: str
    version: int
    timeout_s: float = 30.0
    holder: str = ""


class DrainDone(msgspec.Struct):
    """Scheduler -> repository: whether the version has nothing queued or running any more."""

    drained: bool = True


class LoadRequest(msgspec.Struct, omit_defaults=True):
    """Gateway (or a python model, or a PyTriton process) -> repository, as JSON: load or reload."""

    name: str
    # the client's load parameters as Triton takes them: `config` (JSON text) and `file:<path>`
    # (base64); the repository checks their types (services/repository/overrides.py)
    parameters: dict[str, Any] = {}


class UnloadRequest(msgspec.Struct, omit_defaults=True):
    """-> repository, as JSON: unload a model (and the members only it used, for an ensemble)."""

    name: str
    unload_dependents: bool = False


class DemandRequest(msgspec.Struct):
    """Gateway -> repository, as JSON: load a model on demand (--model-control-mode=on-demand)."""

    name: str
    timeout_s: float = 60.0


class RepositoryDone(msgspec.Struct):
    """Repository -> the caller of a load, unload or demand, as JSON (an error is an `ErrorReply`):
    the last KV revision it wrote, which the caller waits to see before it answers its client."""

    revision: int = 0


class StartupSet(msgspec.Struct):
    """Repository -> a gateway, as JSON: the models it loaded at its start (the repository's
    contents in none/poll mode, `--load-model` and their ensembles' members in explicit mode) and
    the KV revision of the last record it published for them. Sent only once every one of them is
    published: a gateway is not ready before it has this and has seen that revision (strict
    readiness, docs/reliability.md)."""

    revision: int = 0
    models: list[str] = msgspec.field(default_factory=list)


class IndexRequest(msgspec.Struct):
    """Gateway -> repository, as JSON: the repository index, only READY models with `ready`."""

    ready: bool = False


class IndexEntry(msgspec.Struct, omit_defaults=True):
    """One model version in the repository index (Triton's fields, then Shoal's figures for a READY
    one); a model without versions (never loaded) has only its name."""

    name: str
    version: str = ""
    state: ModelState | None = None
    reason: str = ""
    warmup_ms: float | None = None  # the slowest instance's warmup
    memory_bytes: int | None = None  # what its instances took at load, summed over workers
    device_memory_bytes: int | None = None


class RepositoryIndex(msgspec.Struct):
    """Repository -> gateway, as JSON: the answer to an `IndexRequest`."""

    models: list[IndexEntry]


class ModelUsage(msgspec.Struct):
    """Whether a model is in use (a request waits or runs, a sequence holds a slot), and when a
    request of it last completed (wall-clock ms, 0: none yet): what on-demand eviction weighs."""

    busy: bool = False
    last_used_ms: int = 0


class UsageReply(msgspec.Struct):
    """Scheduler -> repository, as JSON: the usage of every model this replica serves."""

    models: dict[str, ModelUsage] = {}
    replicas: int = 0  # the live scheduler replicas this one counts, itself included (0: cannot say)


class MemoryUse(msgspec.Struct):
    """What one worker's instances of a model version took at load (`InstanceRecord`'s figures)."""

    model: str
    version: int
    worker: str
    rss: int
    device: int


class LoadTime(msgspec.Struct):
    """How long a loaded model version took to load: its slowest worker's (`InstanceRecord.load_s`)."""

    model: str
    version: int
    seconds: float


class WorkerBudget(msgspec.Struct):
    """A worker's --model-memory-budget and --max-loaded-models (0: none)."""

    bytes: int = 0
    models: int = 0


class Eviction(msgspec.Struct):
    model: str
    reason: str
    count: int


class ModelFigures(msgspec.Struct):
    """Repository -> gateway, as JSON: the model-management figures /metrics shows (docs/models.md):
    each loaded model's measured memory, the workers' budgets, and on-demand loads, evictions and
    thrash (a model requested again soon after its eviction)."""

    memory: list[MemoryUse] = []
    budgets: dict[str, WorkerBudget] = {}
    evictions: list[Eviction] = []
    loads: dict[str, int] = {}
    thrash: dict[str, int] = {}
    load_times: list[LoadTime] = []


class StatisticsRequest(msgspec.Struct):
    """Gateway -> schedulers, as JSON: the statistics, with these latency quantiles (the metrics' summaries)."""

    quantiles: list[float] = []


class LogSettings(msgspec.Struct):
    """Gateway -> every service, as JSON: Triton's logging settings after a client changed them
    (the logging extension; shared/process/logsettings.py applies them)."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"


class MetricSample(msgspec.Struct):
    """One labelled sample of a python model's custom metric family (`pb_utils.MetricFamily`):
    a counter's or gauge's `value`, or a histogram's bucket `counts` (one more than `buckets`, the
    last is +Inf) and `sum`. MessagePack carries NaN and infinities as they are."""

    labels: dict[str, str]
    value: float = 0.0
    buckets: list[float] = []
    counts: list[int] = []
    sum: float = 0.0


class MetricSnapshot(msgspec.Struct):
    """A custom metric family and its samples, as one process holds them now."""

    name: str
    description: str
    kind: str  # counter, gauge, histogram
    samples: list[MetricSample] = []


class WorkerMetrics(msgspec.Struct):
    """Worker -> gateways, with each heartbeat: its python models' custom metric families, which
    the gateways sum over workers on /metrics (services/gateway/metrics/custom.py)."""

    worker: str
    families: list[MetricSnapshot]
