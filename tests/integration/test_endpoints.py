"""Health, metadata, config, repository index and statistics through tritonclient and raw HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def http(url: str, path: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None):
    request = urllib.request.Request(f"http://{url}{path}", data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def test_health(client, shoal):
    assert client.is_server_live()
    # broken_config and bad_io are UNAVAILABLE: strict readiness says not ready (400, empty body)
    assert not client.is_server_ready()
    status, _, body = http(shoal.url, "/v2/health/ready")
    assert (status, body) == (400, b"")


# tritonserver's list, in its order (core InferenceServer::InferenceServer; docs/triton-spec.md §1.4):
# "sequence" is there, "generate" is not, though Triton serves it
TRITON_EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]


def test_server_metadata(client, shoal):
    assert client.get_server_metadata() == {"name": "triton", "version": "2.73.0", "extensions": TRITON_EXTENSIONS}
    with grpcclient.InferenceServerClient(shoal.grpc_url) as grpc:
        assert list(grpc.get_server_metadata().extensions) == TRITON_EXTENSIONS


def test_model_metadata(client):
    meta = client.get_model_metadata("simple")
    assert meta == {
        "name": "simple",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
    }
    assert client.get_model_metadata("simple", "1")["versions"] == ["1"]
    assert client.get_model_metadata("nobatch")["inputs"][0]["shape"] == [2, -1]


def test_model_config_is_normalized_triton_json(client):
    config = client.get_model_config("mlp")
    assert config["name"] == "mlp" and config["backend"] == "onnxruntime"
    assert config["input"][0]["dims"] == [256]  # int64 as numbers, not strings
    assert config["dynamic_batching"]["preferred_batch_size"] == [64]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert config["instance_group"][0]["kind"] == "KIND_CPU" and config["instance_group"][0]["count"] == 2
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["optimization"]["input_pinned_memory"] == {"enable": True}


def test_autocomplete_from_onnx(client):
    config = client.get_model_config("autocomplete")
    assert config["platform"] == "onnxruntime_onnx" and config["max_batch_size"] == 4
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert config["input"][0]["dims"] == [16] and config["input"][0]["data_type"] == "TYPE_INT32"
    assert "dynamic_batching" in config


def test_model_ready(client):
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert not client.is_model_ready("simple", "7")
    assert not client.is_model_ready("broken_config")
    assert not client.is_model_ready("no_such_model")


@pytest.mark.parametrize("path", ["simple/versions/7", "broken_config", "no_such_model"])
def test_a_model_not_ready_answers_as_tritonserver_2_51(shoal, path):
    # tritonserver 2.51 (and Triton's qa/L0_lifecycle, over HTTP and gRPC): unknown, unloaded or
    # failed alike, 400 with this error; gRPC answers ready=false (docs/compatibility.md)
    status, headers, body = http(shoal.url, f"/v2/models/{path}/ready")
    assert (status, headers["content-type"], json.loads(body)) == (
        400,
        "application/json",
        {"error": "Model version not ready"},
    )
    with grpcclient.InferenceServerClient(shoal.grpc_url) as grpc:
        name, _, version = path.partition("/versions/")
        assert grpc.is_model_ready(name, version) is False


def test_repository_index_shows_reasons(client):
    index = {(e["name"], e.get("version")): e for e in client.get_model_repository_index()}
    assert index[("simple", "1")]["state"] == "READY"
    broken = index[("broken_config", "1")]
    assert broken["state"] == "UNAVAILABLE"
    assert "config.pbtxt" in broken["reason"] and "2:1" in broken["reason"] and "max_batch_sze" in broken["reason"]
    bad = index[("bad_io", "1")]
    assert bad["state"] == "UNAVAILABLE" and bad["reason"]


def test_repository_index_ready_filter(shoal):
    status, _, body = http(shoal.url, "/v2/repository/index", "POST", b'{"ready": true}')
    assert status == 200
    assert all(e["state"] == "READY" for e in json.loads(body))
    status, _, body = http(shoal.url, "/v2/repository/index", "POST", b'{"ready": 3}')
    assert status == 400 and "error" in json.loads(body)


def test_load_unload_refused_outside_explicit_mode(client):
    with pytest.raises(InferenceServerException) as err:
        client.load_model("simple")
    assert err.value.status() == "503"
    assert "polling is enabled" in err.value.message()


def test_statistics_schema(client):
    x = np.zeros((2, 16), dtype=np.int32)
    inputs = [httpclient.InferInput(n, [2, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(x)
    before = client.get_inference_statistics("simple")["model_stats"][0]
    client.infer("simple", inputs)
    after = client.get_inference_statistics("simple", "1")["model_stats"][0]
    assert set(after) >= {
        "name",
        "version",
        "last_inference",
        "inference_count",
        "execution_count",
        "inference_stats",
        "batch_stats",
    }
    assert set(after["inference_stats"]) == {
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    }
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    assert after["inference_count"] == before["inference_count"] + 2
    assert after["execution_count"] == before["execution_count"] + 1
    assert after["last_inference"] > 0
    batch = {b["batch_size"]: b for b in after["batch_stats"]}
    assert set(batch[2]) == {"batch_size", "compute_input", "compute_infer", "compute_output"}
    every = client.get_inference_statistics()["model_stats"]
    assert {"simple", "mlp"} <= {s["name"] for s in every}
    assert "broken_config" not in {s["name"] for s in every}


def test_statistics_errors(shoal):
    status, _, body = http(shoal.url, "/v2/models/no_such/stats")
    assert status == 400 and json.loads(body)["error"] == "requested model 'no_such' is not available"
    status, _, body = http(shoal.url, "/v2/models/simple/versions/9/stats")
    assert status == 400 and "version is not available" in json.loads(body)["error"]


def test_not_found_and_method_not_allowed(shoal):
    for path in ("/v2/notapi", "/notapi/v2", "/v2/models/simple/foo", "/v2/models/simple/versions/x"):
        status, _, body = http(shoal.url, path)
        assert status == 404 and json.loads(body) == {"error": "Not Found"}, path
    status, _, body = http(shoal.url, "/v2/models/simple/infer", "GET")
    assert status == 405 and json.loads(body) == {"error": "Method Not Allowed"}


def test_metrics_have_triton_names(client, shoal):
    from prometheus_client.parser import text_string_to_metric_families

    x = np.zeros((1, 16), dtype=np.int32)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(x)
    client.infer("simple", inputs)
    with urllib.request.urlopen(shoal.metrics_url, timeout=10) as response:
        text = response.read().decode()
        assert response.headers["Content-Type"].startswith("text/plain")
    assert "# TYPE nv_inference_request_success counter" in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    success = [s for s in families["nv_inference_request_success"].samples if s.labels["model"] == "simple"]
    assert success and success[0].labels["version"] == "1" and success[0].value >= 1
    reasons = {
        s.labels["reason"] for s in families["nv_inference_request_failure"].samples if s.labels["model"] == "simple"
    }
    assert reasons == {"REJECTED", "CANCELED", "BACKEND", "OTHER"}
