"""What the autoscaling tests of both engines share (tests/deploy/test_swarm.py,
tests/deploy/test_compose_autoscale.py): client load that records every request, the workers
serving a model as NATS tells it, the real `shoal autoscale` process and its looks, and the
p99 of the queue time seen by the clients, window by window.

A deployment here is a `Stack` or a `Project` (tests/deploy/swarm.py, compose.py): anything with
`url`, `nats_url` and `operator_credentials()`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient

from shoal import topology
from shoal.autoscale.policy import Policy, Signals, pressure
from tests.deploy.compose import ROOT
from tests.serving import record_until

Attempt = Callable[[httpclient.InferenceServerClient], bool]

# one request an execution, 50 ms each whatever the load on the machine's cores: a worker added
# adds capacity here as it would on a host of its own (a CPU-bound model on 2 shared cores would not)
SLEEPER = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.05 * len(requests))
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""


def write_sleeper(models: Path, name: str = "sleeper") -> None:
    """A one-instance python model of 50 ms a request into the repository `models`."""
    (models / name / "1").mkdir(parents=True)
    (models / name / "1" / "model.py").write_text(textwrap.dedent(SLEEPER))
    (models / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 1\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        "dynamic_batching { }\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )


def one_input(model: str) -> Attempt:
    """An attempt at `model` (FP32 [1, 1] in, the same out), true when the answer is right."""

    def attempt(client: httpclient.InferenceServerClient) -> bool:
        tensor = httpclient.InferInput("INPUT0", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.full((1, 1), 5, np.float32))
        return float(client.infer(model, [tensor]).as_numpy("OUTPUT0")[0, 0]) == 5.0

    return attempt


def http(deployment: Any) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(deployment.url, network_timeout=60)


def workers_serving(deployment: Any, model: str) -> dict[str, int]:
    """Worker instance id -> executions of `model`, from `shoal status`'s source (NATS)."""
    credentials = deployment.operator_credentials()
    services = asyncio.run(topology.collect(deployment.nats_url, wait=0.5, credentials=credentials))
    found = {}
    for service in services:
        if service["name"] == "shoal-worker":
            hosted = (service.get("status") or {}).get("models", {}).get(f"{model}/1")
            if hosted is not None:
                found[service["metadata"]["instance"]] = sum(i["executions"] for i in hosted["instance_list"])
    return found


class Load:
    """Client threads inferring until stopped; each request's (started, ended, ok, error), on the
    monotonic clock."""

    def __init__(self, deployment: Any, attempt: Attempt) -> None:
        self.deployment, self.attempt = deployment, attempt
        self.results: list = []
        self.threads: list[tuple[threading.Thread, threading.Event]] = []

    def clients(self, count: int) -> None:
        while len(self.threads) < count:
            stop = threading.Event()
            thread = threading.Thread(target=self._run, args=(stop,))
            thread.start()
            self.threads.append((thread, stop))
        while len(self.threads) > count:
            thread, stop = self.threads.pop()
            stop.set()
            thread.join(90)

    def _run(self, stop: threading.Event) -> None:
        client = http(self.deployment)
        record_until(stop, self.results, lambda: self.attempt(client))
        client.close()

    def ok_since(self, moment: float) -> int:
        return sum(1 for started, _, ok, _ in self.results if ok and started > moment)

    def failures(self) -> list:
        return [(end - started, error) for started, end, ok, error in self.results if not ok]


def under_pressure(policy: Policy, look: dict) -> bool:
    """The controller's look shows a signal over its target (shoal/autoscale/policy.py's rule 3)."""
    signals = Signals(pending=look["pending"], oldest_wait_s=look["oldest_wait_s"])
    return pressure(policy, signals, look["replicas"]) > 1


class Controller:
    """`shoal autoscale` as a process of its own on `target` (its --swarm-service or --compose-project
    flags), reading the deployment's NATS as the operator; `looks` fills with its JSON lines."""

    def __init__(self, deployment: Any, target: list[str], flags: list[str]) -> None:
        argv = [sys.executable, "-m", "shoal.cli", "autoscale", *target, "--nats-url", deployment.nats_url]
        argv += ["--nats-credentials", deployment.operator_credentials(), *flags]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
        )
        self.looks: list[dict] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.looks.append(json.loads(line))

    def stop(self) -> None:
        """SIGINT, as a person's ^C; its log goes to the test's stderr."""
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.reader.join(30)
        assert self.process.stdout is not None and self.process.stderr is not None
        print(self.process.stderr.read()[-3000:], file=sys.stderr)
        self.process.stdout.close()
        self.process.stderr.close()


def p99_windows(results: list, start: float, end: float, floor: float, width: float = 5.0) -> list[float]:
    """The p99 queue time of the requests started in each `width`-second window of [start, end):
    a request's latency less `floor` (the latency of one client alone: the model's time and the
    hops), the clients' view of how long it waited. A window without a request counts as 0."""
    found = []
    edge = start
    while edge + width <= end:
        waits = [ended - started - floor for started, ended, *_ in results if edge <= started < edge + width]
        found.append(float(np.percentile(waits, 99)) if waits else 0.0)
        edge += width
    return found


def back_under(windows: list[float], target: float, hold: int) -> int | None:
    """The first window from which every window is under `target`, when at least `hold` are."""
    first = len(windows)
    while first > 0 and windows[first - 1] <= target:
        first -= 1
    return first if len(windows) - first >= hold else None
