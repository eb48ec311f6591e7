"""Every NATS subject and KV name Shoal uses, built in one place."""

from __future__ import annotations

import re

PREFIX = "shoal"

MODELS_BUCKET = "shoal-models"
INSTANCES_BUCKET = "shoal-instances"
SHM_BUCKET = "shoal-shm-regions"
LEASES_BUCKET = "shoal-leases"  # which scheduler replica serves which model
MODEL_FILES_BUCKET = "shoal-model-files"  # a JetStream object store: model files by SHA-256 (shared/bus/file_store.py)

# gateway -> scheduler: one subject per model, subscribed by the replica holding its lease
SCHEDULER_QUEUE = "schedulers"
# worker -> scheduler: an instance is free / finished a batch
INSTANCE_FREE = f"{PREFIX}.sched.free"
# worker -> schedulers: a decoupled model's first response, sent after its request's completion
FIRST_RESPONSE = f"{PREFIX}.sched.first"
# scheduler -> all workers: re-announce free instances (a scheduler (re)started)
RESYNC = f"{PREFIX}.worker.resync"
WORKER_HEARTBEAT = f"{PREFIX}.worker.heartbeat"
# worker -> schedulers and repository: the process of one of its python models (or instances) exited
WORKER_EXITED = f"{PREFIX}.worker.exited"
# worker -> schedulers: the batches it holds, after a reconnect; scheduler -> workers: say them (after its own)
WORKER_HOLDINGS = f"{PREFIX}.sched.holdings"
HOLDINGS_ASK = f"{PREFIX}.worker.holdings.ask"
WORKER_METRICS = (
    f"{PREFIX}.worker.metrics"  # worker -> every gateway, with each heartbeat: python models' custom metrics
)
SCHEDULER_STATS = f"{PREFIX}.sched.stats"
LOGGING = f"{PREFIX}.logging"  # runtime log settings, applied by every service
SCHEDULER_DRAIN = f"{PREFIX}.sched.drain"
SCHEDULER_CANCEL = f"{PREFIX}.sched.cancel"
SCHEDULER_CACHE = f"{PREFIX}.sched.cache"
CREDITS_REVOKED = f"{PREFIX}.sched.revoke"
# scheduler -> schedulers: live sequences a replica still serves after handing their model over
SCHEDULER_RESIDUE = f"{PREFIX}.sched.residue"
REPOSITORY_INDEX = f"{PREFIX}.repository.index"
REPOSITORY_LOAD = f"{PREFIX}.repository.load"
REPOSITORY_UNLOAD = f"{PREFIX}.repository.unload"
REPOSITORY_DEMAND = f"{PREFIX}.repository.demand"  # on-demand mode: load this model for a waiting request
REPOSITORY_MODELS = f"{PREFIX}.repository.models"  # on-demand figures for /metrics: memory, evictions, loads
# gateway -> repository: the models it loaded at start (`StartupSet`); answered once their records are published
REPOSITORY_STARTED = f"{PREFIX}.repository.started"
# repository -> gateways, first thing at its start: what a previous repository published is going (not ready)
REPOSITORY_STARTING = f"{PREFIX}.startup.repository"
SCHEDULER_USAGE = f"{PREFIX}.sched.usage"  # which models requests wait on, run on or hold a sequence on

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def token(name: str) -> str:
    """Encode a free-form name (model names may hold dots, spaces...) as one subject token."""
    return _UNSAFE.sub(lambda m: "".join(f"={b:02X}" for b in m.group().encode()), name) or "=00"


def untoken(encoded: str) -> str:
    if encoded == "=00":
        return ""
    out = bytearray()
    i = 0
    while i < len(encoded):
        if encoded[i] == "=":
            out.append(int(encoded[i + 1 : i + 3], 16))
            i += 3
        else:
            out += encoded[i].encode()
            i += 1
    return out.decode()


def infer(model: str) -> str:
    return f"{PREFIX}.infer.{token(model)}"


# A scheduler acknowledges the request groups it takes with a message on `held_groups(inbox)`
# carrying this header; its value is the scheduler's liveness subject (see shared/bus/holders.py).
HELD_BY_HEADER = "Shoal-Held-By"
# a scheduler whose connection to NATS was lost and is back says so (header: HELD_BY_HEADER): groups
# on their way to it then were lost in its dead node (shared/bus/holders.py)
SCHEDULER_RECONNECTED = f"{PREFIX}.sched.reconnected"


def scheduler_alive(scheduler_id: str, incarnation: str) -> str:
    """Answered by one scheduler process while it lives (`incarnation`: a restarted process with
    the same id is another holder: it does not have the dead one's queue)."""
    return f"{PREFIX}.sched.alive.{token(scheduler_id)}.{incarnation}"


# every scheduler's `scheduler_alive`: a wildcard for permissions, written out because `token`
# would encode a `*` given as the id (a pattern that matched no subject: workers' pings refused)
ANY_SCHEDULER_ALIVE = f"{PREFIX}.sched.alive.*.*"


def scheduler_sequences(scheduler_id: str) -> str:
    """One scheduler replica: requests of sequences it holds, forwarded by another replica."""
    return f"{PREFIX}.sched.{token(scheduler_id)}.seq"


def worker_exec(worker_id: str) -> str:
    return f"{PREFIX}.worker.{worker_id}.exec"


def worker_sequence(worker_id: str) -> str:
    """One worker: a sequence ended without END (timeout, lost); free what it holds for it."""
    return f"{PREFIX}.worker.{worker_id}.seqend"


def worker_undelivered(worker_id: str) -> str:
    """One worker: "no responders" for a `BatchDone` whose gateway is gone (`.<batch id>`)."""
    return f"{PREFIX}.worker.{worker_id}.undelivered"


def worker_resync(worker_id: str) -> str:
    """One worker: announce your idle credits again."""
    return f"{PREFIX}.worker.{worker_id}.resync"


def worker_alive(worker_id: str) -> str:
    """One worker process answers here while its NATS connection lives (shared/bus/liveness.py)."""
    return f"{PREFIX}.worker.{worker_id}.alive"


def worker_readiness(worker_id: str) -> str:
    """One worker process: are your instances of this model ready (their own `is_ready()`)?"""
    return f"{PREFIX}.worker.{worker_id}.ready"


def worker_report(worker_id: str) -> str:
    """One worker: report your instances again."""
    return f"{PREFIX}.worker.{worker_id}.report"


def gateway_inbox(gateway_id: str) -> str:
    return f"{PREFIX}.gw.{gateway_id}.reply"


def inbox_of(reply: str) -> str:
    """The gateway inbox a per-request reply subject (`<inbox>.<rid>`) belongs to."""
    return reply.rsplit(".", 1)[0]


def response_batch(inbox: str) -> str:
    return f"{inbox}.batch"


def batch_done(inbox: str) -> str:
    """Where a worker sends a `BatchDone` for the scheduler co-hosted with this gateway inbox."""
    return f"{inbox}.done"


def held_groups(inbox: str) -> str:
    """Where a scheduler lists the request groups of this inbox it took (a `HeldGroups`)."""
    return f"{inbox}.held"


def tensor_owner(owner_id: str) -> str:
    """Where a process serves the tensors it holds (chunk fetch and release)."""
    return f"{PREFIX}.tensors.{owner_id}"


def model_key(model: str) -> str:
    return token(model)


def instance_key(worker_id: str, model: str, version: int) -> str:
    return f"{worker_id}.{token(model)}.{version}"
