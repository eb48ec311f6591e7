"""Several workers share a model's load: every worker executes a fair share of the batches."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import tritonclient.http.aio as aioclient

from tests.cluster import running_cluster, scheduler_statuses
from tests.serving import wait_until


def test_three_workers_share_the_load(test_repository):
    with running_cluster(test_repository, workers=3) as running:
        from shoal.topology import collect

        def credits() -> int:  # 3 workers x 2 instances x 2 credits once every worker hosts the mlp
            scheduler = next(s for s in asyncio.run(collect(running.nats.url)) if s["name"] == "shoal-scheduler")
            return scheduler["status"]["queues"].get("mlp/1", {}).get("free_credits", 0)

        wait_until(lambda: credits() >= 12, 60, "the three workers hosting the mlp")

        async def drive() -> None:
            client = aioclient.InferenceServerClient(running.url, conn_limit=12)

            async def one() -> None:
                tensor = aioclient.InferInput("INPUT0", [1, 256], "FP32")
                tensor.set_data_from_numpy(np.ones((1, 256), np.float32))
                await client.infer("mlp", [tensor])

            for _ in range(20):
                await asyncio.gather(*(one() for _ in range(12)))
            stats = await client.get_inference_statistics("mlp")
            await client.close()
            assert stats["model_stats"][0]["inference_count"] >= 240

        asyncio.run(drive())
        scheduler = next(s for s in asyncio.run(collect(running.nats.url)) if s["name"] == "shoal-scheduler")
        assert len(scheduler["status"]["workers"]) == 3
        import json
        import urllib.request

        with urllib.request.urlopen(running.metrics_url, timeout=10) as response:
            text = response.read().decode()
        from prometheus_client.parser import text_string_to_metric_families

        runs = {
            s.labels["worker"]: s.value
            for f in text_string_to_metric_families(text)
            if f.name == "shoal_worker_executions"
            for s in f.samples
            if s.labels["model"] == "mlp"
        }
        assert len(runs) == 3, runs
        shares = [v / sum(runs.values()) for v in runs.values()]
        print("executions share per worker:", json.dumps({k[-6:]: round(v, 3) for k, v in zip(runs, shares)}))
        assert min(shares) > 0.2, shares  # a fair share is 1/3; none starves


def test_two_gateways_answer_alike(tmp_path):
    import tritonclient.http as httpclient

    from services.repository.examples import write_examples

    write_examples(tmp_path)
    # two workers: one hosts simple and mlp (its selector), the other identity_fp32
    selectors = [{"models": ["simple", "mlp*"]}, {"models": ["identity_*"]}]
    with running_cluster(tmp_path, gateways=2, workers_settings=selectors) as running:
        urls = [running.url, f"127.0.0.1:{running.cluster.more_gateways[0].http_port}"]
        clients = [httpclient.InferenceServerClient(url) for url in urls]
        value = np.arange(16, dtype=np.int32).reshape(1, 16)
        answers = []
        for client in clients:
            inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(value)
            answers.append(client.infer("simple", inputs).as_numpy("OUTPUT0"))
        np.testing.assert_array_equal(answers[0], answers[1])
        assert clients[0].get_model_metadata("mlp") == clients[1].get_model_metadata("mlp")
        assert clients[0].get_model_config("simple") == clients[1].get_model_config("simple")
        # each worker hosts only what its selector names
        from shoal.topology import collect

        hosted = sorted(
            sorted(s["status"]["models"]) for s in asyncio.run(collect(running.nats.url)) if s["name"] == "shoal-worker"
        )
        assert hosted == [["identity_fp32/1"], ["mlp/1", "simple/1"]]
        for client in clients:
            client.close()


def test_shutdown_lets_in_flight_requests_finish(tmp_path):
    import threading

    import tritonclient.http as httpclient

    from services.repository import examples
    from tests.integration.slow_model import slow_graph
    from tests.integration.test_scheduling_policies import busy, config

    examples.write_model(tmp_path, "slow", slow_graph(2048), config("slow", ""))
    outcome: list[object] = []
    with running_cluster(tmp_path, worker={"credits_per_instance": 1, "intra_op_threads": 1}) as running:

        def call() -> None:
            client = httpclient.InferenceServerClient(running.url, network_timeout=60)
            tensor = httpclient.InferInput("INPUT0", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.full((1, 1), 7, np.float32))
            try:
                outcome.append(client.infer("slow", [tensor]).as_numpy("OUTPUT0")[0, 0])
            except Exception as exc:
                outcome.append(exc)

        thread = threading.Thread(target=call)
        thread.start()
        wait_until(lambda: busy(running, "slow"), 30, "the slow request running", 0.005)
        # leaving the block stops the cluster (SIGTERM, gateway first) while the request runs
    thread.join(60)
    assert outcome == [7.0], outcome


def test_scheduler_replicas_divide_the_models_and_take_over(tmp_path):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from services.repository.examples import write_examples

    write_examples(tmp_path)
    # standalone replicas (co-hosted ones die with their gateway: test_reliability.py)
    with running_cluster(tmp_path, schedulers=2, supervise=False, request_timeout_s=5, shape="standalone") as running:
        client = httpclient.InferenceServerClient(running.url, network_timeout=30)

        def infer(model: str) -> None:
            shape = [1, 16] if model == "simple" else [1, 256] if model == "mlp" else [1, 4]
            names = ["INPUT0", "INPUT1"] if model == "simple" else ["INPUT0"]
            dtype = np.int32 if model == "simple" else np.float32
            inputs = []
            for name in names:
                tensor = httpclient.InferInput(name, shape, "INT32" if model == "simple" else "FP32")
                tensor.set_data_from_numpy(np.ones(shape, dtype))
                inputs.append(tensor)
            client.infer(model, inputs)

        def owners() -> dict[str, list[str]]:
            return {sid: sorted(status["owned"]) for sid, status in scheduler_statuses(running.nats.url, 0.5).items()}

        models = ("simple", "mlp", "identity_fp32")
        # the models spread over both
        wait_until(lambda: len(owners()) == 2 and all(owners().values()), 30, "two owners", 0.2, detail=owners)
        for model in models:
            infer(model)
        stats = client.get_inference_statistics()["model_stats"]
        assert {s["name"] for s in stats if s["inference_count"]} == set(models)  # merged from both replicas
        # kill the replica that serves `simple`; the other takes it over within the lease TTL
        serving = {
            running.cluster.child("scheduler").settings.scheduler_id: "scheduler",
            running.cluster.more_schedulers[0].scheduler_id: "scheduler-1",
        }
        owner = next(
            name for sid, name in serving.items() if "simple" in owners().get(sid, []) and running.cluster.child(name)
        )
        running.cluster.child(owner).process.kill()

        def taken_over() -> bool:
            started = time.monotonic()
            try:
                infer("simple")
                return True
            except InferenceServerException as exc:
                assert exc.status() == "503", exc  # clear errors while the lease moves
            assert time.monotonic() - started < 10, "a request outlived its deadline"
            return False

        wait_until(taken_over, 30, "a replica taking the model over", 0.2)
        for model in models:
            infer(model)
        client.close()
