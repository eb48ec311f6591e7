"""A worker killed with SIGKILL under load: clear errors, no hang, the restarted worker serves."""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.cluster import running_cluster
from tests.integration.test_scheduling_policies import (
    CREDITS,
    SLEEPY,
    Sender,
    busy,
    failures,
    gauge,
    pending,
    raw_request,
    sleepy_config,
)
from tests.serving import wait_until


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
    wait_until(lambda: outcomes.count("ok") >= 20, 30, "20 answers before the kill", 0.05)
    worker = faulty.cluster.child("worker-0")
    old_pid = worker.process.pid
    os.kill(old_pid, signal.SIGKILL)
    # the supervisor restarts the worker; wait until requests succeed again
    mark = len(outcomes)
    try:
        wait_until(lambda: outcomes[mark:].count("ok") >= 10, 60, "answers again", detail=lambda: outcomes[mark:][-20:])
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert worker.process.pid != old_pid
    assert outcomes[mark:].count("ok") >= 10, outcomes[mark:][-20:]


@pytest.fixture
def gated(tmp_path):
    """One instance of a python model that runs while its gate file exists: batches of one,
    sent ahead to the busy instance (docs/scheduling.md)."""
    name = "gated"
    (tmp_path / name / "1").mkdir(parents=True)
    (tmp_path / name / "1" / "model.py").write_text(textwrap.dedent(SLEEPY))
    config = sleepy_config(name, 1, "", tmp_path / f"{name}.gate").replace("dynamic_batching {  }\n", "")
    (tmp_path / name / "config.pbtxt").write_text(config)
    gate = tmp_path / f"{name}.gate"
    gate.touch()
    try:
        with running_cluster(tmp_path, workers=1) as running:
            wait_until(lambda: gauge(running, "shoal_queue_free_credits", name) == CREDITS, 60)
            yield running, gate
    finally:
        gate.unlink(missing_ok=True)


def test_a_cancelled_request_is_not_failed_again_when_its_worker_dies(gated):
    """A request cancelled while it waited at its instance was answered (CANCELED) already: the
    worker's death fails the request that was running, and only that one."""
    running, gate = gated
    sender = Sender(running, "gated")
    sender.send("running", 0)
    wait_until(lambda: busy(running, "gated") and "running" not in sender.done)
    raw = raw_request(running, "gated")
    wait_until(lambda: pending(running, "gated") == 1 and gauge(running, "shoal_queue_free_credits", "gated") == 0)
    raw.close()
    wait_until(lambda: failures(running, "gated", "CANCELED") == 1)
    os.kill(running.cluster.child("worker-0").process.pid, signal.SIGKILL)
    sender.join()
    outcome = sender.done["running"][1]
    assert isinstance(outcome, InferenceServerException) and "stopped responding" in outcome.message(), outcome
    gate.unlink()
    assert failures(running, "gated", "CANCELED") == 1
    assert failures(running, "gated", "OTHER") == 1
    # the model is unavailable until the restarted worker loads it: the metrics still count
    assert sum(failures(running, "gated", r) for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER")) == 2
