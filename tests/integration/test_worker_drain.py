"""A worker stopped by SIGTERM drains (services/worker/service.py, `WorkerService.drain`): it takes no
new batch, finishes those it holds, then stops; no request fails because it went (docs/scaling.md:
what a scale-down or a rolling update does to a worker)."""

from __future__ import annotations

import signal
import threading

import numpy as np
import tritonclient.http as httpclient

from services.repository import examples
from tests.cluster import running_cluster
from tests.integration.slow_model import slow_graph
from tests.integration.test_scheduling_policies import config
from tests.serving import wait_until


def test_a_worker_stopped_under_load_finishes_its_batches_and_nothing_fails(tmp_path):
    examples.write_model(tmp_path, "slow", slow_graph(512), config("slow", ""))
    results: list[object] = []
    stop = threading.Event()
    with running_cluster(
        tmp_path, workers=2, supervise=False, worker={"intra_op_threads": 1, "drain_timeout_s": 30.0}
    ) as running:

        def load() -> None:
            client = httpclient.InferenceServerClient(running.url, network_timeout=60)
            tensor = httpclient.InferInput("INPUT0", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.full((1, 1), 3, np.float32))
            while not stop.is_set():
                try:
                    results.append(float(client.infer("slow", [tensor]).as_numpy("OUTPUT0")[0, 0]))
                except Exception as exc:
                    results.append(exc)
            client.close()

        clients = [threading.Thread(target=load) for _ in range(4)]
        for thread in clients:
            thread.start()
        try:
            wait_until(lambda: len(results) >= 20, 60, "requests served by both workers")
            leaving = running.cluster.child("worker-1").process
            assert leaving is not None
            leaving.send_signal(signal.SIGTERM)
            assert leaving.wait(60) == 0  # drained within its timeout, then stopped cleanly
            served = len(results)
            wait_until(lambda: len(results) >= served + 20, 60, "the other worker serving alone")
        finally:
            stop.set()
            for thread in clients:
                thread.join(60)
    failed = [r for r in results if isinstance(r, Exception)]
    assert not failed, f"{len(failed)} of {len(results)} requests failed: {failed[:3]}"


def test_a_request_with_no_worker_waits_for_one_to_come(tmp_path):
    """Scale from zero (docs/scaling.md): on demand, a request for a model when no worker runs waits
    for one (the repository's `demand_loads` shows it, which `shoal autoscale` reads) and is served
    once a worker starts, within its deadline."""
    import asyncio

    from shoal import topology
    from shoal.autoscale.signals import from_status

    examples.write_examples(tmp_path)
    with running_cluster(tmp_path, supervise=False, repository={"model_control_mode": "on-demand"}) as running:
        worker = running.cluster.child("worker-0").process
        assert worker is not None
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0
        outcome: list[object] = []

        def call() -> None:
            client = httpclient.InferenceServerClient(running.url, network_timeout=60)
            tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            try:
                outcome.append(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0").tolist())
            except Exception as exc:
                outcome.append(exc)
            client.close()

        thread = threading.Thread(target=call)
        thread.start()

        def waiting() -> bool:
            return from_status(asyncio.run(topology.collect(running.nats.url, wait=0.3))).loads > 0

        wait_until(waiting, 30, "the request waiting for a worker (demand_loads)", 0.1)
        assert not outcome  # still waiting, not failed
        running.cluster.restart("worker-0")
        thread.join(60)
    assert outcome == [[[1.0, 1.0, 1.0, 1.0]]]
