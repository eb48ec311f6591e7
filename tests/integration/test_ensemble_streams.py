"""Ensembles with a decoupled step (preprocess -> generator -> postprocess), streamed over SSE,
against the real services."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.cluster import running_cluster
from tests.integration import stream_models
from tests.serving import wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, shape):
    root = tmp_path_factory.mktemp("ensemble_streams")
    stream_models.write_models(root)
    with running_cluster(root, shape=shape) as running:
        running.root = root
        yield running


def post(url: str, path: str, body: dict, timeout: float = 30) -> tuple[int, bytes]:
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def events(body: bytes) -> list[dict]:
    return [json.loads(chunk[len(b"data: ") :]) for chunk in body.split(b"\n\n") if chunk.startswith(b"data: ")]


def expected(model: str, values: list[int], blob: int = 1) -> list[dict]:
    return [
        {
            "model_name": model,
            "model_version": "1",
            "OUT": (v + 1) * 10 + 1000 * len(values),
            "IDX": i,
            "SUM": float(i * blob),
        }
        for i, v in enumerate(values)
    ]


def test_iterations_stream_in_order_with_upstream_tensors(cluster):
    values = [1, 2, 3, 4, 5]
    status, body = post(cluster.url, "/v2/models/llm/generate_stream", {"IN": values})
    assert status == 200
    assert events(body) == expected("llm", values)


def test_a_nested_decoupled_ensemble_streams_too(cluster):
    values = [4, 5, 6]
    status, body = post(cluster.url, "/v2/models/llm_outer/generate_stream", {"IN": values, "blob": 32_768})
    assert status == 200
    assert events(body) == expected("llm_outer", values, 32_768)


def test_large_intermediates_of_every_iteration_are_freed(cluster):
    post(cluster.url, "/v2/models/llm/generate_stream", {"IN": [1], "blob": 32_768})  # warm
    baseline = cluster.segments()
    values = list(range(8))
    status, body = post(cluster.url, "/v2/models/llm/generate_stream", {"IN": values, "blob": 32_768})  # 128 KiB
    assert status == 200
    assert events(body) == expected("llm", values, 32_768)
    wait_until(lambda: cluster.segments() == baseline)


def test_infer_refuses_the_decoupled_ensemble(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    tensor = httpclient.InferInput("IN", [2], "INT32")
    tensor.set_data_from_numpy(np.array([1, 2], np.int32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("llm", [tensor])
    assert err.value.message() == "HTTP end point doesn't support models with decoupled transaction policy"
    client.close()


def test_generate_takes_a_single_iteration(cluster):
    status, body = post(cluster.url, "/v2/models/llm/generate", {"IN": [7]})
    assert (status, json.loads(body)) == (200, expected("llm", [7])[0])


def test_an_error_mid_stream_ends_it_with_the_ensemble_prefix(cluster):
    baseline = cluster.segments()
    status, body = post(cluster.url, "/v2/models/llm/generate_stream", {"IN": [1, 2, 3], "fail_at": 1, "blob": 32_768})
    assert status == 200
    assert events(body) == [expected("llm", [1, 2, 3], 32_768)[0], {"error": "in ensemble 'llm', failed at 1"}]
    wait_until(lambda: cluster.segments() == baseline)
    stats = httpclient.InferenceServerClient(cluster.url).get_inference_statistics("llm")
    assert stats["model_stats"][0]["inference_stats"]["fail"]["count"] >= 1


def test_max_inflight_requests_one_delivers_everything_in_order(cluster):
    values = list(range(40))
    status, body = post(cluster.url, "/v2/models/llm_one/generate_stream", {"IN": values, "blob": 20_000})
    assert status == 200
    assert events(body) == expected("llm_one", values, 20_000)


def test_client_disconnect_cancels_the_generator(cluster):
    post(cluster.url, "/v2/models/llm/generate_stream", {"IN": [1], "blob": 32_768})  # warm
    baseline = cluster.segments()
    host, port = cluster.url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(
        "POST",
        "/v2/models/llm/generate_stream",
        json.dumps({"IN": list(range(200)), "delay": 0.05, "id": "gone", "blob": 32_768}),
        {"Content-Type": "application/json"},
    )
    response = conn.getresponse()
    assert response.status == 200
    assert response.read(6) == b"data: "  # the stream has started
    conn.sock.close()
    conn.close()
    marker = cluster.root / "gen" / "1" / "cancelled-gone"
    wait_until(lambda: marker.exists(), timeout=10)
    wait_until(lambda: cluster.segments() == baseline)  # the iterations in flight were freed
    # and the ensemble is still serving
    status, body = post(cluster.url, "/v2/models/llm/generate_stream", {"IN": [3]})
    assert (status, events(body)) == (200, expected("llm", [3]))
