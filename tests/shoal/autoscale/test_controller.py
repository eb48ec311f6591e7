"""shoal/autoscale/signals.py and controller.py without Docker: the signals read from what the
services' status endpoints and /metrics answer, and the loop applying the policy to a fake service."""

from __future__ import annotations

import asyncio

from services.gateway.metrics.endpoint import render
from shared.wire.statistics import Duration, InferenceStats, ModelStatistics, VersionStatistics
from shoal.autoscale.controller import parser, policy_of, run
from shoal.autoscale.policy import Policy, Signals
from shoal.autoscale.signals import from_metrics, from_status


def test_status_signals_add_requests_and_take_each_versions_largest_view_of_its_instances():
    queue = {"queued": 3, "free_credits": 1, "running_batches": 2, "oldest_wait_s": 0.4}
    services = [
        {"name": "shoal-scheduler", "status": {"queues": {"m/1": {**queue, "busy_instances": 2, "instances": 4}}}},
        {
            "name": "shoal-scheduler",
            "status": {"queues": {"m/1": {**queue, "queued": 1, "oldest_wait_s": 0.1, "instances": 4, "requests": 9}}},
        },
        {"name": "shoal-repository", "status": {"demand_loads": 1}},
        {"name": "shoal-worker", "status": {"models": {}}},
    ]
    assert from_status(services) == Signals(4, 0.4, 2, 4, 9, 1)


def test_metrics_signals_match_what_the_gateway_renders():
    stats = ModelStatistics("m", "1", inference_stats=InferenceStats(success=Duration(7, 0)))
    value = VersionStatistics(
        stats, fail_reasons={"REJECTED": 2}, pending=5, oldest_wait_us=250_000, busy_instances=3, instances=4
    )
    signals = from_metrics(render({"m/1": value}).decode())
    assert signals == Signals(pending=5, oldest_wait_s=0.25, busy_instances=3, instances=4, requests=9)


class FakeService:
    def __init__(self, replicas: int) -> None:
        self.count = replicas
        self.calls: list[int] = []

    def replicas(self) -> int:
        return self.count

    def scale(self, count: int) -> None:
        self.calls.append(count)
        self.count = count

    def describe(self) -> str:
        return "fake"


async def test_the_loop_scales_up_under_pressure_and_reads_on_after_a_failed_read(capsys):
    readings = iter([RuntimeError("bus away"), Signals(pending=9, oldest_wait_s=1.0), Signals()])
    service, stop = FakeService(1), asyncio.Event()

    async def read() -> Signals:
        reading = next(readings, None)
        if reading is None:
            stop.set()
            return Signals()
        if isinstance(reading, Exception):
            raise reading
        return reading

    await run(Policy(max_replicas=4, scale_up_cooldown_s=0), read, service, 0.0, stop=stop)
    assert service.calls == [2]
    lines = capsys.readouterr().out.splitlines()
    assert '"desired": 2' in lines[0] and '"replicas": 1' in lines[0]


def test_the_flags_make_the_policy():
    args = parser().parse_args(
        ["--swarm-service", "s", "--nats-url", "nats://x", "--min", "0", "--max", "3", "--target-queue-ms", "50"]
    )
    policy = policy_of(args)
    assert (policy.min_replicas, policy.max_replicas, policy.target_queue_s) == (0, 3, 0.05)
