"""Wire messages: msgspec Structs encoded as MessagePack.

The scheduler decodes only `RequestHeader` (a subset of `InferRequest`'s fields)
and forwards each request's original bytes to the worker as `msgspec.Raw`, so
tensor bytes are never decoded or re-encoded on the way (docs/design.md §3).
"""

from __future__ import annotations

from typing import Any

import msgspec


class TensorRef(msgspec.Struct, omit_defaults=True):
    """A tensor and where its bytes are.

    Exactly one location: `data` inline; or `shm` (a POSIX shared-memory segment on
    host `host`); or `key` at `owner` (fetch over the bus in chunks). Shared-memory
    tensors also name an owner so a consumer on another host can still fetch them.
    """

    name: str
    datatype: str
    shape: list[int]
    data: bytes | None = None
    shm: str = ""
    offset: int = 0
    nbytes: int = 0
    host: str = ""
    owner: str = ""
    key: str = ""
    borrowed: bool = False  # a client's registered region: read or written in place, never freed
    in_region: bool = False  # response: the output was written into the client's region, no data here
    cuda_handle: bytes = b""  # a CUDA IPC handle (client CUDA shared memory) instead of `shm`
    device_id: int = 0


class ShmRegion(msgspec.Struct, omit_defaults=True):
    """A client-registered shared-memory region (KV `shoal-shm-regions`), seen by every service."""

    name: str
    kind: str  # "system" or "cuda"
    byte_size: int
    key: str = ""  # system: the shm key the client created
    offset: int = 0
    host: str = ""  # system: the host token of the gateway that registered it
    cuda_handle: bytes = b""
    device_id: int = 0


class InferRequest(msgspec.Struct, omit_defaults=True):
    rid: str  # unique per request, assigned by the gateway
    model: str
    version: int
    reply: str  # the gateway inbox the worker answers to
    deadline_ns: int  # wall clock (time.time_ns) after which nobody waits
    batch_size: int = 1
    shape_sig: str = ""  # shapes of variable-dim inputs; only equal ones batch together
    id: str = ""  # the client's request id, echoed
    inputs: list[TensorRef] = []
    outputs: list[str] = []  # requested output names; empty = all
    output_regions: dict[str, TensorRef] = {}  # outputs to write into client shared memory
    parameters: dict[str, Any] = {}
    priority: int = 0
    timeout_us: int = 0  # the request's `timeout` parameter (queue policy override)
    received_ns: int = 0
    trace: bool = False  # sampled for the trace file: services add their timestamps
    sequence_id: int | str = 0  # correlation id (uint64 or string); 0 / "" = not in a sequence
    sequence_start: bool = False
    sequence_end: bool = False


class RequestHeader(msgspec.Struct):
    """What the scheduler reads of an `InferRequest`; the rest stays opaque."""

    rid: str
    model: str
    version: int
    reply: str
    deadline_ns: int
    batch_size: int = 1
    shape_sig: str = ""
    priority: int = 0
    timeout_us: int = 0
    received_ns: int = 0
    trace: bool = False
    sequence_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False


class RequestDeadline(msgspec.Struct):
    """What a gateway holding a request for a scheduler reads of the `InferRequest` it encoded."""

    deadline_ns: int


class InferResponse(msgspec.Struct, omit_defaults=True):
    rid: str
    model: str = ""
    version: int = 0
    outputs: list[TensorRef] = []
    error: str = ""
    code: str = ""
    parameters: dict[str, Any] = {}
    trace: dict[str, int] = {}  # traced requests: event name -> CLOCK_MONOTONIC ns
    batch: dict[str, Any] = {}  # traced requests: the batch it ran in and why it was sent
    more: bool = False  # decoupled models: more responses to this request follow
    empty: bool = False  # decoupled models: only the final flag, no response to show the client


class ResponseBatch(msgspec.Struct):
    """Worker -> gateway: the responses of one batch for that gateway (each an encoded InferResponse)."""

    responses: list[msgspec.Raw]


class ResponseBatchView(msgspec.Struct):
    """A `ResponseBatch` as the gateway reads it, its responses typed: one decode call for the batch."""

    responses: list[InferResponse]


class RequestBatch(msgspec.Struct):
    """Gateway -> scheduler: requests for one model published in the same loop iteration."""

    requests: list[msgspec.Raw]


class HeldGroups(msgspec.Struct, array_like=True):
    """Scheduler -> dispatcher: the request groups (the last token of each group's reply subject)
    it took since its last `HeldGroups` to this inbox (shared/holders.py)."""

    groups: list[str]


class SeqControl(msgspec.Struct, omit_defaults=True):
    """A sequence request's controls, per request of an `ExecBatch`: the worker builds the
    model's control tensors (and implicit state) from these, so the scheduler never touches tensors."""

    corrid: int | str
    seq: int  # the scheduler's number for this sequence (a reused correlation id gets a new one)
    start: bool = False
    end: bool = False
    slot: int = 0  # the sequence's slot on its instance (direct: its batch row)
    ready: bool = True  # False only for the worker's padding rows of empty direct slots


class SequenceResidue(msgspec.Struct, omit_defaults=True):
    """Scheduler -> schedulers: the live sequences of a model version that a replica still
    serves after handing the model over (see services/scheduler/replicas/handover.py), sent on every
    change and at least every second while it holds any."""

    model: str
    version: int
    holder: str  # the replica's scheduler_id
    final: bool = False  # False: the hand-over overlap, the holder takes every request of the model's sequences
    slots: list[tuple[str, int, int]] = []  # (worker, instance, slot) its sequences hold
    ids: list[int | str] = []  # the correlation ids of its live sequences
    done: bool = False  # it holds nothing any more
    lost: list[int | str] = []  # with done: ids it gave up (their later requests are told why)
    reason: str = ""


class ForwardedRequests(msgspec.Struct):
    """Scheduler -> scheduler: requests of sequences the other replica holds (a `RequestBatch`'s
    requests, as the gateway encoded them); `bounced`: sent back, the sender serves them itself."""

    requests: list[msgspec.Raw]
    sender: str
    bounced: bool = False
    residues: list[SequenceResidue] = []  # with bounced: the sender's residues, to learn before serving them


class SequenceEnded(msgspec.Struct):
    """Scheduler -> worker: a sequence ended without an END request (idle timeout, lost): free its state."""

    model: str
    version: int
    instance: int
    corrid: int | str
    seq: int
    reason: str = ""


class ExecBatch(msgspec.Struct):
    """Scheduler -> worker: run these requests as one batch on one instance."""

    batch_id: int
    model: str
    version: int
    instance: int
    requests: list[msgspec.Raw]
    queue_ns: list[int]
    reply_via_scheduler: bool = False  # preserve_ordering: responses go back in `InstanceFree`
    credit: int = 0  # which of the instance's credits this batch uses
    generation: int = 0  # of the instance the credit belongs to
    reason: str = ""  # why the batcher sent it now (trace and --log-verbose)
    enqueued_ns: list[int] = []  # per request (CLOCK_MONOTONIC), only in a batch with traced requests
    controls: list[SeqControl] = []  # per request, only for sequence-batched models
    # set by a scheduler co-hosted in a gateway when every request came from that gateway: the
    # answers and the completion go there as one `BatchDone` (docs/design.md, "Co-hosting")
    complete_to: str = ""


class RequestDone(msgspec.Struct, omit_defaults=True):
    rid: str
    ok: bool
    response: bytes = b""  # the encoded InferResponse, only with reply_via_scheduler


class InstanceFree(msgspec.Struct, omit_defaults=True):
    """Worker -> scheduler: an instance is free (a credit), maybe after finishing a batch."""

    worker: str
    model: str
    version: int
    instance: int
    subject: str  # where ExecBatch messages for this worker go
    credit: int = 0  # an instance grants a few credits so the next batch waits at the worker
    generation: int = 0
    batch_id: int = -1
    batch_size: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    done: list[RequestDone] = []


class WorkerHoldings(msgspec.Struct):
    """The batches a worker received and has not finished. Sent when its NATS connection is back
    (or a scheduler's is): a batch sent to it before that and not listed was lost with the
    connection, or its completion was, and the scheduler ends it (services/scheduler/batching/credits.py)."""

    worker: str
    batch_ids: list[int]


class BatchDone(msgspec.Struct):
    """Worker -> the gateway whose co-hosted scheduler sent the batch: the batch's answers (each an
    encoded InferResponse) and its completion, which returns the credit, in one message."""

    free: InstanceFree
    responses: list[msgspec.Raw] = []


class BatchDoneView(msgspec.Struct):
    """A `BatchDone` as the gateway reads it, its responses typed."""

    free: InstanceFree
    responses: list[InferResponse] = []


class WorkerHeartbeat(msgspec.Struct):
    worker: str
    subject: str
    host: str
    instances: dict[str, int]  # "model/version" -> instance count
    interval_s: float
    loading: int = 0  # model loads in progress (queued included): a loading worker is never taken for dead
    budget_bytes: int = 0  # --model-memory-budget (0: none); on-demand placement reads it
    max_models: int = 0  # --max-loaded-models (0: no limit)
    models: list[str] = []  # its --models globs (none: every model)
    placeable: bool = True  # False: it hosts only its own models (a python model's process, bound functions)


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


class ModelVersionState(msgspec.Struct, omit_defaults=True):
    state: str  # READY, LOADING, UNAVAILABLE, UNLOADING, UNKNOWN
    reason: str = ""


class ModelRecord(msgspec.Struct, omit_defaults=True):
    """The repository's published view of one model (JetStream KV `shoal-models`).

    Workers host the `hosted` versions at `generation` with `config`. During a reload the
    instances of the previous generation keep serving (`serving_config` is what they run,
    what gateways validate against) until the new generation is ready.
    """

    name: str
    path: str = ""
    config: dict[str, Any] = {}  # normalized ModelConfig (Triton's JSON) of `generation`
    versions: dict[str, ModelVersionState] = {}  # version -> state as clients see it
    generation: int = 0  # bumps on every (re)load so workers reload
    hosted: list[int] = []  # versions workers should have instances of
    serving_config: dict[str, Any] = {}  # config of the generation now serving (empty: `config`)
    serving_path: str = ""  # and its directory
    reason: str = ""  # model-level failure (bad config), shown for every version
    labels: dict[str, list[str]] = {}  # output -> classification labels of `config` (label_filename)
    workers: list[str] = []  # the workers that host it (empty: every worker); on-demand placement sets it
    on_demand: bool = False  # --model-control-mode=on-demand: a request for it loads it when it is not

    @property
    def active_config(self) -> dict[str, Any]:
        return self.serving_config or self.config


class InstanceRecord(msgspec.Struct, omit_defaults=True):
    """A worker's report on its instances of one model version (KV `shoal-instances`)."""

    worker: str
    model: str
    version: int
    generation: int  # the generation last loaded or tried
    state: str  # of that generation: READY, LOADING, UNAVAILABLE
    reason: str = ""
    count: int = 0
    serving_generation: int = 0  # generation of the instances serving now (0 = none)
    warmup_ms: float = 0.0
    rss_bytes: int = 0  # memory its instances took at load: the worker's resident set after - before
    device_bytes: int = 0  # and GPU memory, where there is a GPU


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


class CancelRequest(msgspec.Struct):
    """Gateway -> schedulers: the client of this request is gone."""

    rid: str
    model: str
    version: int


class CacheEvent(msgspec.Struct):
    """Gateway -> schedulers: a response-cache lookup, for the model's statistics."""

    model: str
    version: int
    hit: bool
    ns: int  # lookup (hit) or lookup + insert (miss) time
    duration_ns: int = 0  # a hit's whole request time


class CreditsRevoked(msgspec.Struct):
    """Worker -> schedulers: an instance generation was retired; drop its credits."""

    worker: str
    model: str
    version: int
    generation: int


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


class IndexRequest(msgspec.Struct):
    """Gateway -> repository, as JSON: the repository index, only READY models with `ready`."""

    ready: bool = False


class IndexEntry(msgspec.Struct, omit_defaults=True):
    """One model version in the repository index (Triton's fields, then Shoal's figures for a READY
    one); a model without versions (never loaded) has only its name."""

    name: str
    version: str = ""
    state: str = ""
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


class MemoryUse(msgspec.Struct):
    """What one worker's instances of a model version took at load (`InstanceRecord`'s figures)."""

    model: str
    version: int
    worker: str
    rss: int
    device: int


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


class StatisticsRequest(msgspec.Struct):
    """Gateway -> schedulers, as JSON: the statistics, with these latency quantiles (the metrics' summaries)."""

    quantiles: list[float] = []


class LogSettings(msgspec.Struct):
    """Gateway -> every service, as JSON: Triton's logging settings after a client changed them
    (the logging extension; shared/logsettings.py applies them)."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"


class ErrorReply(msgspec.Struct):
    error: str
    code: str = "INTERNAL"


encoder = msgspec.msgpack.Encoder()


def encode(message: msgspec.Struct) -> bytes:
    return encoder.encode(message)
