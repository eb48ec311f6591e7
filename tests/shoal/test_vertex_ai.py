"""`shoal serve` in Vertex AI's environment, as qa/L0_vertex_ai runs tritonserver: AIP_MODE=PREDICTION
turns the Vertex AI endpoint on (and HTTP and gRPC off), AIP_HTTP_PORT, AIP_HEALTH_ROUTE and
AIP_PREDICT_ROUTE place it; vertex_ai_test.py's requests (requests + tritonclient's body helpers)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from shared.process.natsserver import free_port
from tests.shoal.serving import serve

ADDSUB = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
"""
CONFIG = """name: "addsub"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""
DATA = np.arange(16, dtype=np.int32).reshape(1, 16)


def _repository(root: Path) -> Path:
    (root / "addsub" / "1").mkdir(parents=True)
    (root / "addsub" / "1" / "model.py").write_text(ADDSUB)
    (root / "addsub" / "config.pbtxt").write_text(CONFIG)
    return root


@pytest.fixture(scope="module")
def vertex(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("vertex_ai")
    port = free_port()
    with pytest.MonkeyPatch.context() as env:
        for key, value in (("AIP_MODE", "PREDICTION"), ("AIP_HTTP_PORT", str(port))):
            env.setenv(key, value)
        env.setenv("AIP_HEALTH_ROUTE", "/health")
        env.setenv("AIP_PREDICT_ROUTE", "/predict")
        with serve(_repository(root / "models"), root / "cache") as running:
            running.wait_for("Started Vertex AI HTTPService")
            yield running, f"http://127.0.0.1:{port}"


def _post(url: str, body: bytes, headers: dict[str, str], method: str = "POST") -> tuple[int, Any, bytes]:
    """The status, the headers (case-insensitive) and the body of the answer."""
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def _body(binary_input: bool = False, binary_output: bool = False) -> tuple[bytes, int | None]:
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(DATA, binary_data=binary_input)
    inputs[1].set_data_from_numpy(DATA, binary_data=False)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_output),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    return httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)


def _check(content: bytes, header_length: int | None = None) -> None:
    result = httpclient.InferenceServerClient.parse_response_body(content, header_length=header_length)
    assert result.as_numpy("OUTPUT0").tolist() == (DATA * 2).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == np.zeros_like(DATA).tolist()


def test_the_vertex_environment_serves_vertex_ai_alone(vertex):
    running, url = vertex
    output = running.output()
    assert "Started HTTPService" not in output and "Started GRPCInferenceService" not in output
    assert urllib.request.urlopen(f"{url}/health", timeout=30).status == 200


def test_predict_infers_on_the_one_model(vertex):
    body, _ = _body()
    status, _, content = _post(f"{vertex[1]}/predict", body, {"Content-Type": "application/json"})
    assert status == 200, content
    _check(content)


def test_predict_takes_a_binary_request_and_gives_a_binary_response(vertex):
    body, length = _body(binary_input=True)
    mime = f"application/vnd.vertex-ai-triton.binary+json;json-header-size={length}"
    status, _, content = _post(f"{vertex[1]}/predict", body, {"Content-Type": mime})
    assert status == 200, content
    _check(content)
    body, _ = _body(binary_output=True)
    status, headers, content = _post(f"{vertex[1]}/predict", body, {"Content-Type": "application/json"})
    assert status == 200, content
    _check(content, int(headers["Inference-Header-Content-Length"]))


@pytest.mark.parametrize("size", ["additional-string{}", "{}"])
def test_a_malformed_binary_content_type_is_a_400(vertex, size):
    body, length = _body(binary_input=True)
    prefix = "additional-string/" if size == "{}" else ""
    mime = f"{prefix}application/vnd.vertex-ai-triton.binary+json;json-header-size={size.format(length)}"
    status, _, content = _post(f"{vertex[1]}/predict", body, {"Content-Type": mime})
    assert status == 400 and "error" in json.loads(content)


def test_the_redirect_header_reaches_read_only_endpoints(vertex):
    url = f"{vertex[1]}/predict"
    body, _ = _body()
    status, _, content = _post(url, body, {"X-Vertex-Ai-Triton-Redirect": "v2/models/addsub/infer"})
    assert status == 200, content
    _check(content)
    status, _, content = _post(url, b"", {"X-Vertex-Ai-Triton-Redirect": "v2/models/addsub"})
    assert status == 200 and json.loads(content)["name"] == "addsub"
    status, _, content = _post(url, b"", {"X-Vertex-Ai-Triton-Redirect": "metrics"})
    assert status == 200 and b"nv_inference_request_success" in content
    assert _post(url, b"", {"X-Vertex-Ai-Triton-Redirect": "v2/repository/models/addsub/unload"})[0] == 403
    assert _post(url, b"", {"X-Vertex-Ai-Triton-Redirect": "v2"}, method="PUT")[0] == 405
    assert _post(f"{vertex[1]}/elsewhere", b"", {})[0] == 400


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
