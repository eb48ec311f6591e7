"""Faults under load that must not leave a request to its deadline (docs/reliability.md):
a scheduler killed while it holds queued requests, a worker killed while requests wait at it."""

from __future__ import annotations

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
from tests.cluster import identity_config, running_cluster
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


@pytest.mark.timeout(300)
def test_requests_held_by_a_killed_scheduler_end_within_seconds(tmp_path):
    # a 4 s batching delay: requests sit in the scheduler's queue when it is killed
    examples.write_model(
        tmp_path,
        "held",
        examples.identity_graph(TensorProto.FLOAT, 2, "held"),
        identity_config("held", "FP32", 8, "dynamic_batching { max_queue_delay_microseconds: 4000000 }\n"),
    )
    with running_cluster(tmp_path, request_timeout_s=30) as running:
        value = np.arange(4, dtype=np.float32).reshape(1, 4)
        assert np.array_equal(call(running.url, "held", value)[1], value)  # a batch of one after 4 s
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(call, running.url, "held", value) for _ in range(4)]
            wait_until(lambda: metric(running, "nv_inference_pending_request_count", "held") == 4, 10, "not queued")
            killed = time.monotonic()
            os.kill(running.cluster.child("scheduler").process.pid, signal.SIGKILL)
            results = [f.result() for f in futures]
        for _, result in results:
            if isinstance(result, InferenceServerException):
                assert result.status() == "503" and "scheduler" in result.message(), result
            else:
                assert np.array_equal(result, value)
        latest = max(ended for ended, _ in results) - killed
        assert latest < 5, f"requests held by the dead scheduler ended {latest:.1f}s after the kill"
        # each answer after the kill came from a copy the gateway sent again, and /metrics counts them
        served = sum(1 for _, result in results if not isinstance(result, InferenceServerException))
        resent = metric(running, "shoal_inference_request_resent", "held")
        assert resent >= max(served, 4), (resent, served)  # the dead scheduler held all four
        # the restarted scheduler serves again
        wait_until(lambda: not isinstance(call(running.url, "held", value)[1], Exception), 30, "no recovery")


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
    hears "no responders" and fails the request within about a second, though the heartbeat
    timeout is 30 s (shared/liveness.py)."""
    write_python(tmp_path, "py_slow", "double", batching="", max_batch_size=0)
    patient = {"worker_timeout_s": 30}
    with running_cluster(tmp_path, request_timeout_s=40, scheduler=patient, repository=patient) as running:
        value = np.ones(4, np.float32)
        with ThreadPoolExecutor(1) as pool:
            running_request = pool.submit(call, running.url, "py_slow", value, {"delay_ms": 20000})
            wait_until(lambda: metric(running, "shoal_queue_free_credits", "py_slow") < 2, 10, "not sent")
            killed = time.monotonic()
            os.kill(running.cluster.child("worker-0").process.pid, signal.SIGKILL)
            ended, failed = running_request.result()
        assert isinstance(failed, InferenceServerException) and failed.status() == "503", failed
        assert "stopped responding" in failed.message()
        assert ended - killed < 3, f"the request failed {ended - killed:.1f}s after its worker was killed"
