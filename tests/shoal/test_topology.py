"""`shoal status` reads each service's typed status (shared/wire/status.py) and says it in a line."""

from __future__ import annotations

import msgspec

from shared.wire.status import (
    KINDS,
    GatewayStatus,
    HostedStatus,
    InstanceStatus,
    QueueStatus,
    RepositoryStatus,
    SchedulerStatus,
    SlotStatus,
    Status,
    WorkerStatus,
)
from shoal.topology import describe


def service(kind: str, status: Status) -> dict:
    """What `collect` builds: NATS micro's info, the status as the JSON the endpoint sent, checked."""
    sent = msgspec.json.encode(status)
    return {"name": f"shoal-{kind}", "status": msgspec.to_builtins(msgspec.json.decode(sent, type=KINDS[kind]))}


def test_each_kind_in_a_line():
    gateway = GatewayStatus("0.0.0.0:8000", "off", 3, 2, 0)
    assert describe(service("gateway", gateway)) == "http 0.0.0.0:8000, 3 model(s), 2 request(s) in flight"
    scheduler = SchedulerStatus(
        queues={"m/1": QueueStatus(4, 1, 2)},
        sequences={"s/1": SlotStatus(1, 2, 0, 0, 0, 0)},
        workers=["w1", "w2"],
        probed_workers=["w1"],
        owned=["m"],
        handing_over={},
    )
    assert describe(service("scheduler", scheduler)) == "2 worker(s); m/1: 4 queued/2 running/1 free"
    hosted = HostedStatus(3, 2, 1, 2 << 20, 0, [InstanceStatus("m_0", "KIND_CPU", 0, 7)])
    worker = WorkerStatus(budget_bytes=64 << 20, max_models=0, models={"m/1": hosted})
    assert describe(service("worker", worker)) == (
        "m/1 x2 (1 busy, 2.0 MiB); budget 64.0 MiB; 0 batch(es) over NATS, local channel off"
    )
    local = WorkerStatus(0, 0, {}, batches_over_nats=3, batches_over_channel=97, local_channel="/tmp/s/worker.sock")
    assert describe(service("worker", local)) == "no models; batches: 3 over NATS, 97 over the local channel"
    repository = RepositoryStatus("/models", "explicit", {"m": {"1": "READY"}})
    assert describe(service("repository", repository)) == "/models (explicit): m/1 READY"


def test_an_unreadable_status_is_shown_as_it_came():
    assert describe({"name": "shoal-worker", "status": {"error": "TimeoutError"}}) == '{"error": "TimeoutError"}'
    assert describe({"name": "shoal-other", "status": {"x": 1}}) == '{"x": 1}'
    assert describe({"name": "shoal-gateway", "status": {}}) == "{}"  # a service without a status endpoint
