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
    # OpenTelemetry (shared/tracing/): the W3C context of the request's span, empty when not traced
    traceparent: str = ""
    tracestate: str = ""
    sequence_id: int | str = 0  # correlation id (uint64 or string); 0 / "" = not in a sequence
    sequence_start: bool = False
    sequence_end: bool = False
    # the prompt's prefix blocks, chained hashes (docs/design.md, "Prefix-aware routing"); [] = none
    route: list[int] = []


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
    traceparent: str = ""
    tracestate: str = ""
    sequence_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False
    route: list[int] = []


class RequestDeadline(msgspec.Struct):
    """What a gateway holding a request for a scheduler reads of the `InferRequest` it encoded."""

    deadline_ns: int


class BatchDelivery(msgspec.Struct):
    """A traced request's batch, for its trace: its size, how many requests, why the scheduler sent
    it, and where it ran (Triton's trace fields)."""

    batch_size: int
    batch_requests: int
    batch_reason: str
    worker: str
    instance: int


class InferResponse(msgspec.Struct, omit_defaults=True):
    rid: str
    model: str = ""
    version: int = 0
    outputs: list[TensorRef] = []
    error: str = ""
    code: str = ""
    parameters: dict[str, Any] = {}
    trace: dict[str, int] = {}  # traced requests: event name -> CLOCK_MONOTONIC ns
    batch: BatchDelivery | None = None  # traced requests: the batch it ran in and why it was sent
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
    it took since its last `HeldGroups` to this inbox (shared/bus/holders.py)."""

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
    rescheduled: bool = False  # released with RESCHEDULE: not answered, it runs again (iterative sequences)
    # a decoupled model's first response (wall clock, ns), if it sent one before `execute` returned
    # (else a `FirstResponse` follows): the scheduler's nv_inference_first_response_histogram_ms
    first_response_ns: int = 0


class FirstResponse(msgspec.Struct):
    """Worker -> schedulers: a decoupled model sent a request's first response after `execute`
    returned (its completion went without it); only the request's own scheduler records it."""

    rid: str
    model: str
    version: int
    sent_ns: int  # wall clock


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
    # the worker's local channel, "<host token>|<socket path>" (docs/design.md §9); empty: NATS only
    local: str = ""


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
    supervised: bool = False  # a python model's process: the worker that started it says when it exits


class ReadinessCheck(msgspec.Struct):
    """Gateway -> a worker process hosting the model: ask its instances' own `is_ready()`."""

    model: str  # the model's key
    version: int


class ReadinessAnswer(msgspec.Struct, omit_defaults=True):
    ready: bool
    message: str = ""  # why not, in python_backend's words


class WorkerExited(msgspec.Struct):
    """A worker -> schedulers and repository: the process it started for a python model (or one
    instance of it) exited. `worker` is the id it was started with; the process's own id on the
    bus is that id and a suffix of its incarnation (`<worker>-<random>`)."""

    worker: str
    code: int


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


class ErrorReply(msgspec.Struct):
    error: str
    code: str = "INTERNAL"


encoder = msgspec.msgpack.Encoder()


def encode(message: msgspec.Struct) -> bytes:
    return encoder.encode(message)


class ChunkRequest(msgspec.Struct):
    """A bus-held tensor's bytes asked of its owner (`get`), or released (`release`)."""

    op: str  # "get" | "release"
    keys: list[str]
    offset: int = 0
    size: int = 0
