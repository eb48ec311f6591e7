"""Several workers share a model's load: every worker executes a fair share of the batches."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import tritonclient.http.aio as aioclient

from tests.cluster import running_cluster


def test_three_workers_share_the_load(test_repository):
    with running_cluster(test_repository, workers=3) as running:
        from shared.status import collect

        def credits() -> int:  # 3 workers x 2 instances x 2 credits once every worker hosts the mlp
            scheduler = next(s for s in asyncio.run(collect(running.nats.url)) if s["name"] == "shoal-scheduler")
            return scheduler["status"]["queues"].get("mlp/1", {}).get("free_credits", 0)

        deadline = time.monotonic() + 60
        while credits() < 12:
            assert time.monotonic() < deadline, "the three workers never all hosted the mlp"
            time.sleep(0.1)

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

        runs = {s.labels["worker"]: s.value for f in text_string_to_metric_families(text)
                if f.name == "shoal_worker_executions" for s in f.samples if s.labels["model"] == "mlp"}
        assert len(runs) == 3, runs
        shares = [v / sum(runs.values()) for v in runs.values()]
        print("executions share per worker:", json.dumps({k[-6:]: round(v, 3) for k, v in zip(runs, shares)}))
        assert min(shares) > 0.2, shares  # a fair share is 1/3; none starves
