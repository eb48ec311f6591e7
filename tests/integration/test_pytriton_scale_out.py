"""Two copies of examples/pytriton/scale_out_server.py joined to one cluster (`--nats-url`): both
serve the model behind one endpoint; one stopping leaves the other serving; one killed mid-load
fails only its in-flight requests, clearly, while the other keeps serving."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.cluster import Running, running_cluster
from tests.serving import wait_until

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "pytriton" / "scale_out_server.py"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Running]:
    # the cluster a script joins must load models on request, as the embedded one does
    with running_cluster(tmp_path, workers=0, repository={"model_control_mode": "explicit"}) as running:
        yield running


_LOGS: dict[int, IO[str]] = {}  # a script's pid -> its output


@contextlib.contextmanager
def server(nats_url: str) -> Iterator[subprocess.Popen]:
    log = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--nats-url", nats_url], stdout=log, stderr=subprocess.STDOUT, env=os.environ
    )
    _LOGS[process.pid] = log
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
        del _LOGS[process.pid]


def serving(process: subprocess.Popen, timeout: float = 60) -> None:
    """Until the script says it serves: past `bind()`, into `serve()`, which handles SIGINT. Its
    instances answer a moment before that: a SIGINT then is a KeyboardInterrupt inside `bind()`."""
    log = _LOGS[process.pid]

    def serving() -> bool:
        log.seek(0)
        if "serving Square" in log.read():
            return True
        assert process.poll() is None, "the script ended before it said it serves"
        return False

    wait_until(serving, timeout, "the script saying it serves", 0.05)


def wait_workers(url: str, count: int, timeout: float = 120) -> None:
    """Until `count` distinct processes answer (each answers with its pid)."""
    seen: set[int] = set()

    def answered() -> bool:
        seen.update(pid for pid, _ in infer_many(url, 8))
        return len(seen) >= count

    wait_until(answered, timeout, f"{count} workers answering", 0.2, (InferenceServerException,), lambda: seen)


def infer_many(url: str, count: int, threads: int = 8) -> list[tuple[int, float]]:
    results: list[tuple[int, float]] = []
    lock = threading.Lock()

    errors: list[BaseException] = []

    def run(n: int) -> None:
        client = httpclient.InferenceServerClient(url, network_timeout=60)
        try:
            for i in range(n):
                x = httpclient.InferInput("x", [1, 1], "FP32")
                x.set_data_from_numpy(np.array([[float(i)]], np.float32))
                answer = client.infer("Square", [x])
                with lock:
                    results.append((int(answer.as_numpy("pid")[0][0]), float(answer.as_numpy("y")[0][0])))
        except BaseException as exc:
            errors.append(exc)
        finally:
            client.close()

    workers = [threading.Thread(target=run, args=(count // threads,)) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    if errors:
        raise errors[0]
    return results


def test_two_processes_share_the_model_and_one_leaves_cleanly(cluster: Running):
    with server(cluster.nats.url) as first, server(cluster.nats.url) as second:
        wait_workers(cluster.url, 2)
        pids = {pid for pid, _ in infer_many(cluster.url, 64)}
        assert pids <= {first.pid, second.pid}
        serving(second)
        second.send_signal(signal.SIGINT)  # leaves: withdraws its instances, the model stays
        assert second.wait(60) == 0
        results = infer_many(cluster.url, 32)
        assert {pid for pid, _ in results} == {first.pid}
        serving(first)
        first.send_signal(signal.SIGINT)  # the last one: unloads the model
        assert first.wait(60) == 0
    client = httpclient.InferenceServerClient(cluster.url)
    index = {e["name"]: e for e in client.get_model_repository_index()}
    client.close()
    assert index["Square"]["state"] == "UNAVAILABLE" and index["Square"]["reason"] == "unloaded"


def test_one_process_killed_mid_load(cluster: Running):
    with server(cluster.nats.url) as survivor, server(cluster.nats.url) as victim:
        wait_workers(cluster.url, 2)
        outcomes: list[tuple[float, str, str]] = []  # (when the request started, status, pid or message)
        lock = threading.Lock()
        stop = threading.Event()

        def load() -> None:
            client = httpclient.InferenceServerClient(cluster.url, network_timeout=60)
            x = httpclient.InferInput("x", [1, 1], "FP32")
            x.set_data_from_numpy(np.array([[2.0]], np.float32))
            try:
                while not stop.is_set():
                    started = time.monotonic()
                    try:
                        answer = client.infer("Square", [x])
                        outcome = (started, "ok", str(int(answer.as_numpy("pid")[0][0])))
                    except InferenceServerException as exc:
                        outcome = (started, str(exc.status()), exc.message())
                    with lock:
                        outcomes.append(outcome)
            finally:
                client.close()

        threads = [threading.Thread(target=load) for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # load under way on both processes
        victim.kill()
        victim.wait()
        killed = time.monotonic()
        # the scheduler gives a silent worker 3 s (the test cluster's worker_timeout_s); then the survivor alone
        settled = killed + 5
        while time.monotonic() < settled + 3:
            time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join(90)
            assert not t.is_alive(), "a request hung"
        for _, status, message in outcomes:  # the victim's in-flight requests: a clear error, never a hang
            assert status == "ok" or (status == "503" and "stopped responding" in message), (status, message)
        later = [(status, who) for started, status, who in outcomes if started > settled]
        assert len(later) > 10
        assert set(later) == {("ok", str(survivor.pid))}, collections.Counter(later)
        assert {who for _, status, who in outcomes if status == "ok"} >= {str(survivor.pid), str(victim.pid)}
