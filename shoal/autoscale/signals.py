"""The autoscaling signals, read where KEDA, an HPA and `shoal autoscale` read them (docs/scaling.md):
the services' NATS status endpoints (`shoal status`'s source, with an operator identity), or a
gateway's `/metrics`. Both give the policy the same `Signals` (shoal/autoscale/policy.py)."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from shoal.autoscale.policy import Signals


def from_status(services: Iterable[dict[str, Any]]) -> Signals:
    """From `shoal.topology.collect`: the scheduler replicas' queues and the repository's on-demand
    loads. Requests waiting add up over the replicas; instances are a replica's view of the same
    workers, so each model version counts the largest any replica reports."""
    pending, oldest, requests, loads = 0, 0.0, 0, 0
    busy: dict[str, int] = {}
    known: dict[str, int] = {}
    for service in services:
        status = service.get("status") or {}
        if service.get("name") == "shoal-repository":
            loads += int(status.get("demand_loads", 0))
            continue
        if service.get("name") != "shoal-scheduler":
            continue
        for key, queue in (status.get("queues") or {}).items():
            pending += int(queue.get("queued", 0))
            oldest = max(oldest, float(queue.get("oldest_wait_s", 0.0)))
            requests += int(queue.get("requests", 0))
            busy[key] = max(busy.get(key, 0), int(queue.get("busy_instances", 0)))
            known[key] = max(known.get(key, 0), int(queue.get("instances", 0)))
    return Signals(pending, oldest, sum(busy.values()), sum(known.values()), requests, loads)


def from_metrics(text: str) -> Signals:
    """From a gateway's `/metrics` (Triton's names, and Shoal's beside them). It has no on-demand
    loads: a deployment at zero workers is woken through NATS only (docs/scaling.md)."""
    sums: dict[str, float] = {}
    oldest = 0.0
    busy = 0.0
    instances: dict[tuple[str, str], float] = {}
    utilization: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")  # the parser's name for a counter's sample
            key = (sample.labels.get("model", ""), sample.labels.get("version", ""))
            if name == "shoal_queue_oldest_wait_seconds":
                oldest = max(oldest, sample.value)
            elif name == "shoal_model_instances":
                instances[key] = sample.value
            elif name == "shoal_instance_utilization":
                utilization[key] = sample.value
            else:
                sums[name] = sums.get(name, 0.0) + sample.value
    busy = sum(round(utilization.get(key, 0.0) * count) for key, count in instances.items())
    answered = sums.get("nv_inference_request_success", 0.0) + sums.get("nv_inference_request_failure", 0.0)
    return Signals(
        pending=int(sums.get("nv_inference_pending_request_count", 0)),
        oldest_wait_s=oldest,
        busy_instances=int(busy),
        instances=int(sum(instances.values())),
        requests=int(answered),
    )


async def read_nats(url: str, credentials: str = "") -> Signals:
    from shoal.topology import collect

    return from_status(await collect(url, wait=0.5, credentials=credentials))


async def read_metrics(url: str) -> Signals:
    def fetch() -> str:
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    return from_metrics(await asyncio.to_thread(fetch))
