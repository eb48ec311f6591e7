"""Services that stop or stall: every request ends by its deadline with a clear error, and
serving resumes when the service is back."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.cluster import running_cluster
from tests.serving import wait_until


def infer(url: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(url, network_timeout=30)
    try:
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
        return client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0")
    finally:
        client.close()


def wait_serving(url: str, timeout: float = 60) -> None:
    wait_until(lambda: infer(url) is not None, timeout, "an answer", errors=(InferenceServerException,))


@pytest.fixture(scope="module")
def unsupervised(test_repository):
    # standalone: a scheduler process that can be gone while its gateway lives
    with running_cluster(test_repository, supervise=False, request_timeout_s=1.5, shape="standalone") as running:
        yield running


def test_scheduler_gone_answers_503_then_recovers(unsupervised):
    scheduler = unsupervised.cluster.child("scheduler")
    scheduler.process.terminate()
    scheduler.process.wait(10)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as err:
        infer(unsupervised.url)
    # the request waited for a scheduler within its 1.5 s deadline, then says why it failed
    message = err.value.message()
    assert err.value.status() == "503" and "no scheduler is serving requests for model 'identity_fp32'" in message, (
        message
    )
    assert 0.5 < time.monotonic() - started < 3.0
    unsupervised.cluster.restart("scheduler")
    wait_serving(unsupervised.url)
    np.testing.assert_array_equal(infer(unsupervised.url), np.arange(4, dtype=np.float32).reshape(1, 4))


def test_stalled_worker_request_ends_at_its_deadline(unsupervised):
    worker = unsupervised.cluster.child("worker-0")
    os.kill(worker.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as err:
            infer(unsupervised.url)
        elapsed = time.monotonic() - started
        assert err.value.status() == "503" and err.value.message() == "Request timeout expired"
        assert 1.4 < elapsed < 5, elapsed
    finally:
        os.kill(worker.process.pid, signal.SIGCONT)
    wait_serving(unsupervised.url)
