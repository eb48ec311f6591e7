"""The response cache: an identical request answers without executing; shapes are in the key."""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto
from prometheus_client.parser import text_string_to_metric_families

from services.repository import examples
from tests.cluster import identity_config, running_cluster


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
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
    with running_cluster(root, cache_bytes=1 << 20) as running:
        yield running


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
    first = stats(client, "cached")
    np.testing.assert_array_equal(infer(client, "cached", value), value)
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
