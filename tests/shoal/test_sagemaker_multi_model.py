"""SageMaker's multi-model API (`/models`) on `shoal serve --allow-sagemaker=true`, as Triton's
qa/L0_sagemaker/sagemaker_multi_model_test.py drives tritonserver (its `serve` script with
SAGEMAKER_MULTI_MODEL=true: an empty repository in explicit mode): load from a directory, 409 on
loading it again, list, get, invoke (JSON and binary), unload, 404 for a model not loaded, an
ensemble loaded under the target header's name; the texts compared with src/sagemaker_server.cc
and core's model_repository_manager.cc."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from shared.process.natsserver import free_port
from tests.shoal.cloud_requests import check, post, request_body
from tests.shoal.serving import addsub_repository, one_model_repository, serve

MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
JSON = {"Content-Type": "application/json"}
ENSEMBLE = """name: "fan"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
ensemble_scheduling { step [ { model_name: "addsub" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" } } ] }
"""


def archives(root: Path) -> dict[str, Path]:
    """SageMaker's layout, /opt/ml/models/<hash>/model, under `root`: two single models and an
    ensemble's repository (qa's model_1, model_2 and 123456789ensemble)."""
    addsub_repository(root / "staging")
    one_model_repository(root / "staging", "identity")
    urls = {"model_1": root / "123456789abcdefghi" / "model", "model_2": root / "987654321ihgfedcba" / "model"}
    for url in urls.values():
        url.parent.mkdir(parents=True)
    shutil.copytree(root / "staging" / "addsub", urls["model_1"])
    shutil.copytree(root / "staging" / "identity", urls["model_2"])
    urls["ensemble"] = root / "123456789ensemble" / "model"
    shutil.copytree(root / "staging" / "addsub", urls["ensemble"] / "addsub")
    (urls["ensemble"] / "fan" / "1").mkdir(parents=True)
    (urls["ensemble"] / "fan" / "config.pbtxt").write_text(ENSEMBLE)
    return urls


@pytest.fixture(scope="module")
def mme(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("sagemaker_mme")
    (root / "models").mkdir()  # the serve script's empty repository
    port = free_port()
    flags = (
        "--allow-sagemaker=true",
        f"--sagemaker-port={port}",
        "--model-control-mode=explicit",
        f"--sagemaker-models-root={root / 'opt'}",  # SageMaker's /opt/ml/models, here a temporary one
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SAGEMAKER_TRITON_PING_MODE", "live")  # as the serve script sets it for multi-model
        with serve(root / "models", root / "cache", *flags) as running:
            running.wait_for("Started Sagemaker HTTPService")
            yield running, f"http://127.0.0.1:{port}/models", archives(root / "opt")


def load(url: str, name: str, path: Path | str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    body = json.dumps({"model_name": name, "url": str(path)}).encode()
    status, _, content = post(url, body, {**JSON, **(headers or {})})
    return status, content


def get(url: str) -> tuple[int, bytes]:
    status, _, content = post(url, b"", {}, method="GET")
    return status, content


def test_load_list_get_invoke_unload(mme):
    serving, url, paths = mme
    assert load(url, "sm_mme_model_1", paths["model_1"]) == (200, b"")
    status, content = load(url, "sm_mme_model_1", paths["model_1"])  # again: core's register refuses it
    repository = str(paths["model_1"].parent)
    assert status == 409 and json.loads(content) == {
        "error": f"model repository '{repository}' has already been registered"
    }
    assert load(url, "sm_mme_model_2", paths["model_2"]) == (200, b"")
    assert "Loading SageMaker TargetModel: sm_mme_model_1" in serving.output()

    status, content = get(url)
    listed = json.loads(content)["models"]
    assert status == 200 and sorted(listed, key=lambda m: m["modelName"]) == [
        {"modelName": "sm_mme_model_1", "modelUrl": repository},
        {"modelName": "sm_mme_model_2", "modelUrl": str(paths["model_2"].parent)},
    ]
    status, content = get(f"{url}/sm_mme_model_1")
    assert status == 200 and json.loads(content) == {"modelName": "sm_mme_model_1", "modelUrl": repository}
    assert get(f"{url}/sm_non_loaded_model") == (404, b"")

    invoke_json(url, "sm_mme_model_1")
    invoke_binary(url, "sm_mme_model_2")
    assert post(f"{url}/sm_non_loaded_model/invoke", request_body()[0], JSON)[0] == 404

    for name in ("sm_mme_model_1", "sm_mme_model_2"):
        assert post(f"{url}/{name}", b"", {}, method="DELETE")[:1] == (200,)
    assert post(f"{url}/sm_non_loaded_model", b"", {}, method="DELETE")[0] == 404
    assert json.loads(get(url)[1]) == {"models": []}
    assert post(f"{url}/sm_mme_model_1/invoke", request_body()[0], JSON)[0] == 404


def invoke_json(url: str, name: str) -> None:
    body, _ = request_body()
    status, headers, content = post(f"{url}/{name}/invoke", body, JSON)
    assert status == 200, content
    assert json.loads(content)["model_name"] == name and headers["Content-Type"] == "application/json"
    check(content)


def invoke_binary(url: str, name: str) -> None:
    """qa's model_2 request: a binary input and output, the header size in the content type."""
    data = np.arange(8, dtype=np.float32).reshape(1, 8)
    inputs = [httpclient.InferInput("INPUT0", [1, 8], "FP32")]
    inputs[0].set_data_from_numpy(data, binary_data=True)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    body, length = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    status, headers, content = post(f"{url}/{name}/invoke", body, {"Content-Type": f"{MIME}{length}"})
    assert status == 200, content
    result = httpclient.InferenceServerClient.parse_response_body(
        content, header_length=int(headers["Content-Type"][len(MIME) :])
    )
    assert result.as_numpy("OUTPUT0").tolist() == data.tolist()


def test_an_ensemble_loads_with_its_steps_under_the_target_name(mme):
    serving, url, paths = mme
    target = {"X-Amzn-SageMaker-Target-Model": "123456789ensemble"}
    assert load(url, "123456789ensemble", paths["ensemble"], target) == (200, b"")
    assert json.loads(get(f"{url}/123456789ensemble")[1])["modelUrl"] == str(paths["ensemble"])
    invoke_json(url, "123456789ensemble")
    http = f"http://127.0.0.1:{serving.http_port}/v2/models"
    assert get(f"{http}/addsub/ready")[0] == 200  # its step, loaded under its own name
    assert post(f"{url}/123456789ensemble", b"", target, method="DELETE")[0] == 200
    assert get(f"{url}/123456789ensemble") == (404, b"")
    assert get(f"{http}/123456789ensemble/ready")[0] != 200
    assert get(f"{http}/addsub/ready")[0] != 200  # unloaded with its dependents, as tritonserver does


def test_a_url_that_is_no_repository_is_refused(mme):
    _, url, paths = mme
    status, content = load(url, "sm_nowhere", paths["model_1"].parent.parent / "missing" / "model")
    missing = paths["model_1"].parent.parent / "missing" / "model"
    assert status == 400 and json.loads(content) == {"error": f"failed to register '{missing}', repository not found"}
    assert load(url, "sm_proc", "/proc/self") == (400, b"")  # tritonserver answers with no body
    assert json.loads(get(url)[1]) == {"models": []}


def test_a_model_that_fails_to_load_is_a_400_and_not_listed(mme):
    broken = mme[2]["model_1"].parent.parent / "brokenhash" / "model"  # beside the others, under the root
    shutil.copytree(mme[2]["model_1"], broken)
    (broken / "1" / "model.py").write_text("raise RuntimeError('this model cannot load')\n")
    status, content = load(mme[1], "sm_broken", broken)
    assert status == 400 and "this model cannot load" in json.loads(content)["error"]
    assert json.loads(get(mme[1])[1]) == {"models": []}
    assert load(mme[1], "sm_broken", broken)[0] == 400  # a failed load registered nothing: no 409


def test_ping_and_plain_http_are_unchanged(mme):
    assert urllib.request.urlopen(mme[1].replace("/models", "/ping"), timeout=30).status == 200
    assert post(mme[1].replace("/models", "/unknown"), b"", {}, method="GET")[0] == 400


def test_a_url_outside_sagemakers_model_directories_is_refused_with_tritons_text(mme):
    _, url, _ = mme
    for outside in ("/", "/etc", "/opt/ml/models/h/model"):  # the last: not under this serve's root
        status, content = load(url, "sm_outside", outside)
        assert status == 400, (outside, status, content)
        assert json.loads(content)["error"].startswith(f"Invalid \"url\" '{outside}': expected a path of the form ")
