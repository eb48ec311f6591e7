"""A worker killed with SIGKILL under load: clear errors, no hang, the restarted worker serves."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.cluster import running_cluster


@pytest.fixture(scope="module")
def faulty(test_repository):
    with running_cluster(test_repository, workers=1) as running:
        yield running


def infer_mlp(client: httpclient.InferenceServerClient) -> None:
    tensor = httpclient.InferInput("INPUT0", [64, 256], "FP32")
    tensor.set_data_from_numpy(np.ones((64, 256), np.float32))
    client.infer("mlp", [tensor])


def test_worker_killed_under_load(faulty):
    outcomes: list[str] = []
    stop = threading.Event()

    def load() -> None:
        client = httpclient.InferenceServerClient(faulty.url, network_timeout=60)
        while not stop.is_set():
            started = time.monotonic()
            try:
                infer_mlp(client)
                outcomes.append("ok")
            except InferenceServerException as exc:
                assert exc.status() in ("503", "500", "404"), exc
                assert exc.message(), "errors must say what happened"
                outcomes.append(f"error {exc.status()}")
            assert time.monotonic() - started < 45, "a request hung past its deadline"
        client.close()

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while outcomes.count("ok") < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = faulty.cluster.child("worker-0")
    old_pid = worker.process.pid
    os.kill(old_pid, signal.SIGKILL)
    # the supervisor restarts the worker; wait until requests succeed again
    mark = len(outcomes)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and outcomes[mark:].count("ok") < 10:
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(60)
    assert worker.process.pid != old_pid
    assert outcomes[mark:].count("ok") >= 10, outcomes[mark:][-20:]
