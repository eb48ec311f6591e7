"""What each kind of Shoal service may publish and subscribe to on NATS (docs/security.md).

Pure data, built from the subjects and bucket names of `shared/wire/subjects.py`: the embedded
nats-server's configuration (`shared/process/credentials.py`) and `shoal credentials` write it
into an `authorization` block. The rules that matter most (docs/design.md §9):

- only `repository` writes model state (`$KV.shoal-models.>`) and model files (`$O.shoal-model-files.>`),
  and only it may create, change, purge or delete their streams; the others read them;
- only `repository` publishes its announcements to the other services (a worker's report request,
  a scheduler's drain, the usage poll), and only it may listen where load and index requests go;
- a worker cannot listen where requests wait for a scheduler (`shoal.infer.>`);
- `operator` reads (micro `$SRV` info and status, statistics, the index, JetStream state) and writes nothing.

Static permissions cannot tell one worker from another: any worker may answer any gateway's
inbox and credit any scheduler (docs/security.md, "What a compromised worker can reach").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.wire import subjects as s

GATEWAY, SCHEDULER, WORKER, INSTANCE, REPOSITORY, OPERATOR = (
    "gateway",
    "scheduler",
    "worker",
    "instance",
    "repository",
    "operator",
)
KINDS = (GATEWAY, SCHEDULER, WORKER, INSTANCE, REPOSITORY, OPERATOR)
ADMIN = "admin"  # everything: made only on request (`shoal credentials --admin`, the tests' own clients)

MODELS_STREAM = f"KV_{s.MODELS_BUCKET}"
FILES_STREAM = f"OBJ_{s.MODEL_FILES_BUCKET}"


@dataclass(frozen=True)
class Permissions:
    publish: list[str]
    subscribe: list[str]
    publish_deny: list[str] = field(default_factory=list)
    subscribe_deny: list[str] = field(default_factory=list)


def kv(bucket: str) -> str:
    """The subjects a KV bucket's puts and deletes are published to."""
    return f"$KV.{bucket}.>"


# JetStream's API (reading, watching, consuming), acknowledgements and flow control, and the replies
# to requests (nats-py's inboxes): every service needs them
JETSTREAM = ["$JS.API.>", "$JS.ACK.>", "$JS.FC.>"]
REPLIES = "_INBOX.>"
# what changes the repository's streams, denied to every other service
REPOSITORY_STREAMS = [
    f"$JS.API.STREAM.{verb}.{stream}"
    for stream in (MODELS_STREAM, FILES_STREAM)
    for verb in ("CREATE", "UPDATE", "DELETE", "PURGE", "MSG.DELETE", "RESTORE")
]
REPOSITORY_ONLY = [
    kv(s.MODELS_BUCKET),
    f"$O.{s.MODEL_FILES_BUCKET}.>",
    s.worker_report("*"),
    s.SCHEDULER_DRAIN,
    s.SCHEDULER_USAGE,
    s.REPOSITORY_STARTING,
    *REPOSITORY_STREAMS,
]
REPOSITORY_REQUESTS = [
    s.REPOSITORY_INDEX,
    s.REPOSITORY_LOAD,
    s.REPOSITORY_UNLOAD,
    s.REPOSITORY_DEMAND,
    s.REPOSITORY_STARTED,
]
# a service's own micro registration ($SRV.PING/INFO/STATS) and status endpoint
SERVICES = ["$SRV.>", "shoal.topology.>"]  # micro and each status endpoint (shared/bus/discovery.py)
# a scheduler replica's work: take requests, send batches, answer gateways, keep its leases
SCHEDULING = [
    "shoal.infer.>",
    "shoal.sched.>",
    s.RESYNC,
    s.HOLDINGS_ASK,
    s.worker_exec("*"),
    s.worker_sequence("*"),
    s.worker_resync("*"),
    s.worker_alive("*"),
    "shoal.gw.>",
    "shoal.tensors.>",
    kv(s.LEASES_BUCKET),
]
# a worker's work: answer gateways, credit schedulers, beat, report its instances; BLS requests and
# model control from a python model (through the scheduler and the repository, as a gateway's)
WORKING = [
    "shoal.gw.>",
    s.INSTANCE_FREE,
    s.FIRST_RESPONSE,
    s.WORKER_HOLDINGS,
    s.CREDITS_REVOKED,
    s.SCHEDULER_CANCEL,
    s.ANY_SCHEDULER_ALIVE,
    s.WORKER_HEARTBEAT,
    s.WORKER_EXITED,
    s.WORKER_METRICS,
    "shoal.infer.>",
    "shoal.tensors.>",
    *REPOSITORY_REQUESTS,
    kv(s.INSTANCES_BUCKET),
]
EVERY_SERVICE_SUBSCRIBES = [REPLIES, "$SRV.>", "shoal.>"]

_SCHEDULER = Permissions(
    publish=[REPLIES, *JETSTREAM, *SCHEDULING],
    subscribe=EVERY_SERVICE_SUBSCRIBES,
    publish_deny=REPOSITORY_ONLY,
    subscribe_deny=["shoal.repository.>"],
)
_WORKER = Permissions(
    publish=[REPLIES, *JETSTREAM, *WORKING],
    subscribe=EVERY_SERVICE_SUBSCRIBES,
    publish_deny=REPOSITORY_ONLY,
    subscribe_deny=["shoal.repository.>", "shoal.infer.>"],
)

TABLE: dict[str, Permissions] = {
    # a gateway co-hosts a scheduler replica (docs/design.md §7): its rights and the front ends'
    GATEWAY: Permissions(
        publish=[
            *_SCHEDULER.publish,
            *REPOSITORY_REQUESTS,
            s.REPOSITORY_MODELS,
            s.LOGGING,
            kv(s.SHM_BUCKET),
            s.worker_readiness("*"),  # model readiness asks the instances' own is_ready()
        ],
        subscribe=EVERY_SERVICE_SUBSCRIBES,
        publish_deny=REPOSITORY_ONLY,
        subscribe_deny=["shoal.repository.>"],
    ),
    SCHEDULER: _SCHEDULER,
    WORKER: _WORKER,
    # a python model's own process is a worker for that model (services/worker/python/processes/):
    # the same rights under a name of its own, seen apart in /connz and revoked apart
    INSTANCE: _WORKER,
    REPOSITORY: Permissions(
        publish=[REPLIES, *JETSTREAM, "shoal.>", "$KV.>", "$O.>"], subscribe=EVERY_SERVICE_SUBSCRIBES
    ),
    OPERATOR: Permissions(
        publish=[
            *SERVICES,
            s.SCHEDULER_STATS,
            s.REPOSITORY_INDEX,
            "$JS.API.INFO",
            "$JS.API.STREAM.INFO.>",
            "$JS.API.STREAM.NAMES",
            "$JS.API.STREAM.LIST",
            "$JS.API.STREAM.MSG.GET.>",
            "$JS.API.DIRECT.GET.>",
            "$JS.API.CONSUMER.INFO.>",
            "$JS.API.CONSUMER.NAMES.>",
            "$JS.API.CONSUMER.LIST.>",
            "$JS.API.CONSUMER.CREATE.>",  # a KV watch is an ephemeral consumer: it reads, and expires
        ],
        subscribe=[REPLIES, s.WORKER_HEARTBEAT, s.WORKER_METRICS],
    ),
    ADMIN: Permissions(publish=[">"], subscribe=[">"]),
}


def for_kind(kind: str) -> Permissions:
    try:
        return TABLE[kind]
    except KeyError:
        raise ValueError(f"no NATS identity kind '{kind}' (one of {', '.join(TABLE)})") from None
