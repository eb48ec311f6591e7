"""--rate-limit execution_count: two models whose instances need the one unit of resource R
never execute at the same time (seen in the trace's compute timestamps)."""

from __future__ import annotations

import json
import threading

import numpy as np
import tritonclient.http as httpclient

from services.repository import examples
from tests.cluster import running_cluster
from tests.integration.slow_model import slow_graph
from tests.integration.test_scheduling_policies import config


def test_shared_resource_serialises_executions(tmp_path, shape):
    limiter = 'rate_limiter { resources [ { name: "R" count: 1 } ] }'
    for name in ("rl_a", "rl_b"):
        text = config(name, "").replace("count: 1 kind: KIND_CPU", f"count: 1 kind: KIND_CPU {limiter}")
        examples.write_model(tmp_path / "models", name, slow_graph(768), text)
    trace = tmp_path / "trace.json"
    with running_cluster(
        tmp_path / "models",
        scheduler={"rate_limit": "execution_count", "rate_limit_resource": ["R:1"]},
        worker={"intra_op_threads": 1},
        trace_file=str(trace),
        trace_level="TIMESTAMPS",
        trace_rate=1,
        shape=shape,
    ) as running:

        def send(model: str) -> None:
            client = httpclient.InferenceServerClient(running.url)
            tensor = httpclient.InferInput("INPUT0", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
            client.infer(model, [tensor])
            client.close()

        threads = [threading.Thread(target=send, args=(m,)) for m in ("rl_a", "rl_b") * 3]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        records = json.loads(trace.read_text())
    spans = []
    for record in records:
        if "timestamps" in record:
            stamps = {t["name"]: t["ns"] for t in record["timestamps"]}
            spans.append((stamps["COMPUTE_START"], stamps["COMPUTE_END"]))
    assert len(spans) == 6
    spans.sort()
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end, "two executions that both need R overlapped"
