"""`shoal serve` in Vertex AI's environment, as qa/L0_vertex_ai runs tritonserver: AIP_MODE=PREDICTION
turns the Vertex AI endpoint on (and HTTP and gRPC off), AIP_HTTP_PORT, AIP_HEALTH_ROUTE and
AIP_PREDICT_ROUTE place it; vertex_ai_test.py's requests (requests + tritonclient's body helpers)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from shared.process.natsserver import free_port
from tests.shoal.cloud_requests import check, post, request_body
from tests.shoal.serving import addsub_repository, serve


@pytest.fixture(scope="module")
def vertex(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("vertex_ai")
    port = free_port()
    with pytest.MonkeyPatch.context() as env:
        for key, value in (("AIP_MODE", "PREDICTION"), ("AIP_HTTP_PORT", str(port))):
            env.setenv(key, value)
        env.setenv("AIP_HEALTH_ROUTE", "/health")
        env.setenv("AIP_PREDICT_ROUTE", "/predict")
        with serve(addsub_repository(root / "models"), root / "cache") as running:
            running.wait_for("Started Vertex AI HTTPService")
            yield running, f"http://127.0.0.1:{port}"


def test_the_vertex_environment_serves_vertex_ai_alone(vertex):
    running, url = vertex
    output = running.output()
    assert "Started HTTPService" not in output and "Started GRPCInferenceService" not in output
    assert urllib.request.urlopen(f"{url}/health", timeout=30).status == 200


def test_predict_infers_on_the_one_model(vertex):
    body, _ = request_body()
    status, _, content = post(f"{vertex[1]}/predict", body, {"Content-Type": "application/json"})
    assert status == 200, content
    check(content)


def test_predict_takes_a_binary_request_and_gives_a_binary_response(vertex):
    body, length = request_body(binary_input=True)
    mime = f"application/vnd.vertex-ai-triton.binary+json;json-header-size={length}"
    status, _, content = post(f"{vertex[1]}/predict", body, {"Content-Type": mime})
    assert status == 200, content
    check(content)
    body, _ = request_body(binary_output=True)
    status, headers, content = post(f"{vertex[1]}/predict", body, {"Content-Type": "application/json"})
    assert status == 200, content
    check(content, int(headers["Inference-Header-Content-Length"]))


@pytest.mark.parametrize("size", ["additional-string{}", "{}"])
def test_a_malformed_binary_content_type_is_a_400(vertex, size):
    body, length = request_body(binary_input=True)
    prefix = "additional-string/" if size == "{}" else ""
    mime = f"{prefix}application/vnd.vertex-ai-triton.binary+json;json-header-size={size.format(length)}"
    status, _, content = post(f"{vertex[1]}/predict", body, {"Content-Type": mime})
    assert status == 400 and "error" in json.loads(content)


def test_the_redirect_header_reaches_read_only_endpoints(vertex):
    url = f"{vertex[1]}/predict"
    body, _ = request_body()
    status, _, content = post(url, body, {"X-Vertex-Ai-Triton-Redirect": "v2/models/addsub/infer"})
    assert status == 200, content
    check(content)
    status, _, content = post(url, b"", {"X-Vertex-Ai-Triton-Redirect": "v2/models/addsub"})
    assert status == 200 and json.loads(content)["name"] == "addsub"
    status, _, content = post(url, b"", {"X-Vertex-Ai-Triton-Redirect": "metrics"})
    assert status == 200 and b"nv_inference_request_success" in content
    assert post(url, b"", {"X-Vertex-Ai-Triton-Redirect": "v2/repository/models/addsub/unload"})[0] == 403
    assert post(url, b"", {"X-Vertex-Ai-Triton-Redirect": "v2"}, method="PUT")[0] == 405
    assert post(f"{vertex[1]}/elsewhere", b"", {})[0] == 400


def test_a_missing_route_stops_the_start_in_tritons_words(tmp_path, monkeypatch):
    monkeypatch.setenv("AIP_HEALTH_ROUTE", "/health")
    monkeypatch.delenv("AIP_PREDICT_ROUTE", raising=False)
    done = subprocess.run(
        [sys.executable, "-m", "shoal.cli", "serve", "--allow-vertex-ai=true", f"--model-repository={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "failed to start Vertex AI service: API_PREDICT_ROUTE is not defined for Vertex AI endpoint" in done.stderr
