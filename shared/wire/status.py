"""What each service's NATS micro `status` endpoint answers (shared/bus/discovery.py), as JSON: what it
is doing now. `shoal status` reads these; so can `nats req shoal.topology.<service>.<id> ''`."""

from __future__ import annotations

import msgspec

from shared.wire.records import ModelState


class GatewayStatus(msgspec.Struct):
    http: str  # address:port
    grpc: str  # address:port, or "off"
    models: int  # models this gateway knows
    requests_in_flight: int
    shm_regions: int  # registered shared-memory regions


class QueueStatus(msgspec.Struct):
    queued: int  # requests not started yet
    free_credits: int  # instance credits the queue may send a batch on now
    running_batches: int  # batches in flight: running, or sent ahead to wait at their instance
    # the autoscaling signals (docs/serving.md, "Metrics"; docs/scaling.md)
    oldest_wait_s: float = 0.0  # how long the longest-waiting request not started yet has waited
    busy_instances: int = 0  # instances holding a batch of this version
    instances: int = 0  # instances this replica knows (by a credit or a batch)
    requests: int = 0  # requests answered (success or failure) since this replica started


class SlotStatus(msgspec.Struct):
    """How a sequence-batched model version's slots are used."""

    instances: int
    free_slots: int
    bound: int  # sequences holding a slot
    live: int  # sequences that started and did not end
    backlog: int  # sequences waiting for a slot
    reserved: int  # slots held for a sequence another replica hands over


class SchedulerStatus(msgspec.Struct):
    queues: dict[str, QueueStatus]  # "model/version" ->
    sequences: dict[str, SlotStatus]  # "model/version" -> (sequence-batched ones)
    workers: list[str]  # workers seen beating
    probed_workers: list[str]  # those NATS would show gone at once (shared/bus/liveness.py)
    owned: list[str]  # models whose lease this replica holds
    handing_over: dict[str, str]  # "model/version" -> "overlap" or "final": sequences it still serves


class InstanceStatus(msgspec.Struct):
    name: str  # Triton's instance name
    kind: str  # KIND_CPU, KIND_GPU
    device: int
    executions: int  # batches run


class HostedStatus(msgspec.Struct):
    """One model version a worker hosts."""

    generation: int
    instances: int
    busy_instances: int
    rss_bytes: int  # what its instances took at load (shared/memory/footprint.py)
    device_bytes: int
    instance_list: list[InstanceStatus]


class WorkerStatus(msgspec.Struct):
    budget_bytes: int  # --model-memory-budget (0: none)
    max_models: int  # --max-loaded-models (0: no limit)
    models: dict[str, HostedStatus]  # "model/version" ->
    # how its batches came: over NATS, or over the local channel (docs/design.md §9), which
    # nats-server's own counters no longer see
    batches_over_nats: int = 0
    batches_over_channel: int = 0
    batches_hot_loop: int = 0  # of those, run on the channel's thread (a python instance's hot loop)
    local_channel: str = ""  # the socket it listens on; empty: off


class RepositoryStatus(msgspec.Struct):
    repository: str  # its root directory
    mode: str  # --model-control-mode
    models: dict[str, dict[str, ModelState]]  # model -> version -> state
    demand_loads: int = 0  # on-demand loads under way: requests wait for them (docs/scaling.md)


Status = GatewayStatus | SchedulerStatus | WorkerStatus | RepositoryStatus
KINDS: dict[str, type[Status]] = {
    "gateway": GatewayStatus,
    "scheduler": SchedulerStatus,
    "worker": WorkerStatus,
    "repository": RepositoryStatus,
}
