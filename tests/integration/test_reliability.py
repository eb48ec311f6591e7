"""Faults under load that must not leave a request to its deadline (docs/reliability.md):
a scheduler killed while it holds queued requests (a standalone one, or a gateway with the
scheduler it co-hosts), a worker killed while requests wait at it."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from services.repository import examples
from shared.bus.dispatch import SCHEDULER_WAIT_S
from shoal.topology import collect
from tests.cluster import identity_config, running_cluster, scheduler_statuses
from tests.integration.ensemble_models import write_python
from tests.serving import command_of, descendants, wait_until


def metric(running, name: str, model: str) -> float:
    with urllib.request.urlopen(running.metrics_url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + "{") and f'model="{model}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def call(url: str, model: str, value: np.ndarray, parameters: dict | None = None):
    """(when it ended: time.monotonic(), output or the error) of one request."""
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    name = "X" if model.startswith("py") else "INPUT0"
    tensor = httpclient.InferInput(name, list(value.shape), "FP32")
    tensor.set_data_from_numpy(value)
    try:
        result = client.infer(model, [tensor], parameters=parameters).as_numpy("Y" if name == "X" else "OUTPUT0")
    except InferenceServerException as exc:
        result = exc
    finally:
        client.close()
    return time.monotonic(), result


def write_held(root) -> None:
    """A 4 s batching delay: requests sit in the scheduler's queue when it is killed."""
    examples.write_model(
        root,
        "held",
        examples.identity_graph(TensorProto.FLOAT, 2, "held"),
        identity_config("held", "FP32", 8, "dynamic_batching { max_queue_delay_microseconds: 4000000 }\n"),
    )


def check_held_requests_end(results: list, killed: float, value: np.ndarray) -> None:
    """Served (sent again, to the scheduler that took the model over) or a 503 saying why, well before
    the 30 s deadline: the death is found in about a second, a re-sent request waits at most
    `SCHEDULER_WAIT_S` for the model's next scheduler, whose batch then waits out the 4 s delay."""
    for _, result in results:
        if isinstance(result, InferenceServerException):
            assert result.status() == "503" and "scheduler" in result.message(), result
        else:
            assert np.array_equal(result, value)
    latest = max(ended for ended, _ in results) - killed
    bound = 2 + SCHEDULER_WAIT_S + 4 + 2
    assert latest < bound, f"requests held by the dead scheduler ended {latest:.1f}s after the kill"


@pytest.mark.timeout(300)
def test_requests_held_by_a_killed_scheduler_end_within_seconds(tmp_path):
    write_held(tmp_path)
    with running_cluster(tmp_path, request_timeout_s=30, shape="standalone") as running:
        value = np.arange(4, dtype=np.float32).reshape(1, 4)
        assert np.array_equal(call(running.url, "held", value)[1], value)  # a batch of one after 4 s
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(call, running.url, "held", value) for _ in range(4)]
            wait_until(lambda: metric(running, "nv_inference_pending_request_count", "held") == 4, 10, "not queued")
            killed = time.monotonic()
            os.kill(running.cluster.child("scheduler").process.pid, signal.SIGKILL)
            results = [f.result() for f in futures]
        check_held_requests_end(results, killed, value)
        # each answer after the kill came from a copy the gateway sent again, and /metrics counts them
        served = sum(1 for _, result in results if not isinstance(result, InferenceServerException))
        resent = metric(running, "shoal_inference_request_resent", "held")
        assert resent >= max(served, 4), (resent, served)  # the dead scheduler held all four
        # the restarted scheduler serves again
        wait_until(lambda: not isinstance(call(running.url, "held", value)[1], Exception), 30, "no recovery")


def lease_holder(running, model: str = "held") -> str | None:
    """The id of the scheduler replica serving `model` (a co-hosted one has its gateway's id)."""
    return next((sid for sid, status in scheduler_statuses(running.nats.url).items() if model in status["owned"]), None)


@pytest.mark.timeout(300)
def test_requests_queued_at_a_killed_gateways_scheduler_end_within_seconds(tmp_path):
    """Co-hosted: a gateway dies with its scheduler replica and the requests other gateways sent
    it; they end within seconds, and the other replica takes the model over."""
    write_held(tmp_path)
    with running_cluster(tmp_path, request_timeout_s=30, gateways=2, supervise=False, shape="cohost") as running:
        gateways = {g.gateway_id: g for g in (running.cluster.gateway, *running.cluster.more_gateways)}
        wait_until(lambda: lease_holder(running) is not None, 30, "no replica serves the model")
        owner = lease_holder(running)
        other = next(g for gid, g in gateways.items() if gid != owner)
        url = f"127.0.0.1:{other.http_port}"  # its requests go over the bus to the owner's replica
        value = np.arange(4, dtype=np.float32).reshape(1, 4)
        # first, one batch of both gateways' requests (a full batch of 8 leaves at once): each
        # gateway gets its answers, and the credit comes back (the next batch runs)
        urls = [f"127.0.0.1:{g.http_port}" for g in gateways.values()] * 4
        for _ in range(2):
            with ThreadPoolExecutor(8) as pool:
                assert all(np.array_equal(r, value) for _, r in pool.map(lambda u: call(u, "held", value), urls))
        # counted when the scheduler reads the completion, which may come after the answers
        wait_until(lambda: metric(running, "nv_inference_exec_count", "held") == 2, 10, "two executions")
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(call, url, "held", value) for _ in range(4)]
            wait_until(lambda: metric(running, "nv_inference_pending_request_count", "held") == 4, 10, "not queued")
            dying = next(c for c in running.cluster.children if c.settings is gateways[owner])
            killed = time.monotonic()
            dying.process.kill()
            results = [f.result() for f in futures]
        check_held_requests_end(results, killed, value)
        # the lease expires and the surviving gateway's replica takes the model over
        wait_until(lambda: lease_holder(running) == other.gateway_id, 30, "no takeover")
        wait_until(lambda: not isinstance(call(url, "held", value)[1], Exception), 30, "no recovery")


@pytest.mark.timeout(300)
def test_a_request_waiting_at_a_killed_worker_runs_on_another_instance(tmp_path):
    write_python(tmp_path, "py_slow", "double", batching="", max_batch_size=0)
    with running_cluster(tmp_path, request_timeout_s=40) as running:
        value = np.ones(4, np.float32)
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(call, running.url, "py_slow", value, {"delay_ms": 3000})
            wait_until(
                lambda: (
                    metric(running, "nv_inference_pending_request_count", "py_slow") == 0
                    and metric(running, "shoal_queue_free_credits", "py_slow") < 2
                ),
                10,
                "first not sent",
            )
            second = pool.submit(call, running.url, "py_slow", value * 3, {"delay_ms": 10})
            # both batches are at the model's process: the first running, the second waiting behind it
            wait_until(lambda: metric(running, "shoal_queue_free_credits", "py_slow") == 0, 10, "second not sent")
            worker = running.cluster.child("worker-0").process.pid
            [model_process] = [p for p in descendants(worker) if "py_slow" in command_of(p)]
            os.kill(model_process, signal.SIGKILL)
            _, failed = first.result()
            _, retried = second.result()
        assert isinstance(failed, InferenceServerException) and failed.status() == "503", failed
        assert "stopped responding" in failed.message()
        assert np.array_equal(retried, value * 6), retried
        assert metric(running, "shoal_inference_request_retry", "py_slow") == 1


@pytest.mark.timeout(300)
def test_a_killed_worker_is_found_by_nats_not_by_its_heartbeat(tmp_path):
    """kill -9 of the worker running a request: NATS drops its connection, the scheduler's probe
    hears "no responders" and drops it with its python model's process (which dies with it), and
    fails the request within about a second, though the heartbeat timeout is 30 s
    (shared/bus/liveness.py)."""
    write_python(tmp_path, "py_slow", "double", batching="", max_batch_size=0)
    patient = {"worker_timeout_s": 30}
    with running_cluster(tmp_path, request_timeout_s=40, scheduler=patient, repository=patient) as running:
        value = np.ones(4, np.float32)
        assert np.array_equal(call(running.url, "py_slow", value)[1], value * 2)  # its process runs

        def probed() -> bool:  # a worker the probe never heard answer is left to its heartbeat
            services = asyncio.run(collect(running.nats.url, wait=0.3))
            schedulers = [s["status"] for s in services if s["name"] == "shoal-scheduler"]
            # the worker answers the probe; its model's process (not probed: it goes with its worker) is known
            return bool(schedulers) and all(
                len(s.get("probed_workers", [])) >= 1 and len(s.get("workers", [])) >= 2 for s in schedulers
            )

        wait_until(probed, 20, "the scheduler's probe never heard the worker and its model's process")
        with ThreadPoolExecutor(1) as pool:
            running_request = pool.submit(call, running.url, "py_slow", value, {"delay_ms": 20000})
            wait_until(lambda: metric(running, "shoal_queue_free_credits", "py_slow") < 2, 10, "not sent")
            killed = time.monotonic()
            os.kill(running.cluster.child("worker-0").process.pid, signal.SIGKILL)
            ended, failed = running_request.result()
        assert isinstance(failed, InferenceServerException) and failed.status() == "503", failed
        assert "stopped responding" in failed.message()
        assert ended - killed < 3, f"the request failed {ended - killed:.1f}s after its worker was killed"
