"""The response cache: an identical request answers without executing; shapes are in the key.
Each test runs against Triton's `local` cache and against its `redis` cache (issue 38 item 7),
the latter on a real redis-server the tests start on a free port."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
import uuid

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto
from prometheus_client.parser import text_string_to_metric_families

from services.repository import examples
from shared.process.natsserver import free_port
from tests.cluster import identity_config, running_cluster, scheduler_statuses
from tests.serving import wait_until

REDIS_SERVER = shutil.which("redis-server")


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory):
    """A real redis-server (Debian's package, which .ci/run installs) on a free port."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (Debian's package redis-server; .ci/run installs it)")
    import redis

    port = free_port()
    directory = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(directory)],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)

    def answers() -> bool:
        assert process.poll() is None, "redis-server ended"
        return bool(client.ping())

    try:
        wait_until(answers, 30, "redis-server answering", 0.05, (redis.ConnectionError,))
    except AssertionError:
        process.kill()
        raise
    yield port
    client.close()
    process.terminate()
    process.wait(10)


@pytest.fixture(scope="module", params=["local", "redis"])
def cached(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    examples.write_model(
        root,
        "cached",
        examples.identity_graph(TensorProto.FLOAT, 2, "cached"),
        identity_config("cached", "FP32", 8, "response_cache { enable: true }\n"),
    )
    examples.write_model(
        root,
        "uncached",
        examples.identity_graph(TensorProto.FLOAT, 2, "uncached"),
        identity_config("uncached", "FP32", 8),
    )
    if request.param == "local":
        cache: dict = {"cache_bytes": 1 << 20}
    else:
        port = request.getfixturevalue("redis_port")
        cache = {"cache_redis": ["host=127.0.0.1", f"port={port}", f"db={_next_db()}"], "gateways": 2}
    with running_cluster(root, **cache) as running:
        if request.param == "redis":  # two gateways, each with its scheduler
            wait_until(lambda: _spread(running), 30, "the models spread over both schedulers", 0.2)
        yield running


def _spread(running) -> bool:
    """Both scheduler replicas hold a model. The first replica up takes both models and hands one
    to the second once it counts it: a hit or miss told while a model moves between replicas is
    counted by neither (docs/reliability.md, "Statistics across scheduler replicas"), so the tests
    count once the models have settled."""
    statuses = scheduler_statuses(running.nats.url)
    return len(statuses) == 2 and all(status["owned"] for status in statuses.values())


_dbs = iter(range(1, 16))


def _next_db() -> int:
    """A Redis database of its own per cluster: nothing cached by an earlier one is seen."""
    return next(_dbs)


def infer(client, model: str, value: np.ndarray) -> np.ndarray:
    tensor = httpclient.InferInput("INPUT0", list(value.shape), "FP32")
    tensor.set_data_from_numpy(value)
    return client.infer(model, [tensor]).as_numpy("OUTPUT0")


def stats(client, model: str) -> dict:
    return client.get_inference_statistics(model)["model_stats"][0]


def test_identical_request_is_answered_from_the_cache(cached):
    client = httpclient.InferenceServerClient(cached.url)
    value = np.arange(8, dtype=np.float32).reshape(1, 8)
    np.testing.assert_array_equal(infer(client, "cached", value), value)
    # the gateway tells the model's scheduler of each hit and miss by a message (the scheduler of
    # another gateway, with two): the statistics show them a moment later
    wait_until(lambda: stats(client, "cached")["inference_stats"]["cache_miss"]["count"] >= 1, 10, "the miss")
    # the execution is counted when the worker's completion reaches the scheduler: apart from the miss
    wait_until(lambda: stats(client, "cached")["execution_count"] >= 1, 10, "the execution")
    first = stats(client, "cached")
    np.testing.assert_array_equal(infer(client, "cached", value), value)
    hits = first["inference_stats"]["cache_hit"]["count"]
    wait_until(lambda: stats(client, "cached")["inference_stats"]["cache_hit"]["count"] > hits, 10, "the hit")
    second = stats(client, "cached")
    assert second["execution_count"] == first["execution_count"]  # not executed again
    assert second["inference_count"] == first["inference_count"]
    assert second["inference_stats"]["cache_hit"]["count"] == first["inference_stats"]["cache_hit"]["count"] + 1
    assert second["inference_stats"]["success"]["count"] == first["inference_stats"]["success"]["count"] + 1
    assert first["inference_stats"]["cache_miss"]["count"] >= 1
    # the same bytes in another shape is another request (Triton's key would collide here)
    reshaped = value.reshape(2, 4)
    np.testing.assert_array_equal(infer(client, "cached", reshaped), reshaped)
    assert stats(client, "cached")["execution_count"] == second["execution_count"] + 1
    client.close()


def test_models_without_response_cache_always_execute(cached):
    client = httpclient.InferenceServerClient(cached.url)
    value = np.ones((1, 4), np.float32)
    before = stats(client, "uncached")["execution_count"]
    infer(client, "uncached", value)
    infer(client, "uncached", value)
    after = stats(client, "uncached")
    assert after["execution_count"] == before + 2 and after["inference_stats"]["cache_hit"]["count"] == 0
    client.close()


def test_cache_metrics(cached):
    with urllib.request.urlopen(cached.metrics_url, timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    hits = [s for s in families["nv_cache_num_hits_per_model"].samples if s.labels["model"] == "cached"]
    assert hits and hits[0].value >= 1
    assert not [s for s in families["nv_cache_num_hits_per_model"].samples if s.labels["model"] == "uncached"]


def test_gateways_share_the_redis_cache(cached, request):
    """With `--cache-config redis,...` a request first answered through one gateway is a hit
    through another (the local cache is per gateway)."""
    if not cached.cluster.more_gateways:
        pytest.skip("the local cache is per gateway")
    other = httpclient.InferenceServerClient(f"127.0.0.1:{cached.cluster.more_gateways[0].http_port}")
    first = httpclient.InferenceServerClient(cached.url)
    value = np.full((1, 7), float(uuid.uuid4().int % 1000), np.float32)
    before = stats(first, "cached")
    np.testing.assert_array_equal(infer(first, "cached", value), value)
    executed = before["execution_count"] + 1
    wait_until(lambda: stats(first, "cached")["execution_count"] == executed, 10, "the execution")
    hits = stats(first, "cached")["inference_stats"]["cache_hit"]["count"]
    np.testing.assert_array_equal(infer(other, "cached", value), value)
    wait_until(lambda: stats(first, "cached")["inference_stats"]["cache_hit"]["count"] > hits, 10, "the hit")
    assert stats(first, "cached")["execution_count"] == executed
