"""`shoal serve --allow-sagemaker=true` as qa/L0_sagemaker runs tritonserver (its `serve` script sets
SAGEMAKER_TRITON_DEFAULT_MODEL_NAME and the port): sagemaker_test.py's requests against /ping and
/invocations, and the multi-model API outside explicit mode (tests/shoal/test_sagemaker_multi_model.py
has the rest)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from services.repository.service import NOT_EXPLICIT
from shared.process.natsserver import free_port
from shoal.cli import parse_serve
from tests.shoal.cloud_requests import DATA, check, post, request_body
from tests.shoal.serving import addsub_repository, serve

MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="


@pytest.fixture(scope="module")
def sagemaker(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("sagemaker")
    port = free_port()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", "addsub")
        flags = (
            "--allow-sagemaker=true",
            f"--sagemaker-port={port}",
            "--sagemaker-thread-count=4",
            f"--sagemaker-models-root={root / 'opt'}",  # SageMaker's /opt/ml/models, here a temporary one
        )
        with serve(addsub_repository(root / "models"), root / "cache", *flags) as running:
            running.wait_for("Started Sagemaker HTTPService")
            yield running, f"http://127.0.0.1:{port}", root / "opt"


def test_ping_answers_once_ready(sagemaker):
    assert urllib.request.urlopen(f"{sagemaker[1]}/ping", timeout=30).status == 200
    assert "--sagemaker-thread-count=4 has no effect in Shoal" in sagemaker[0].output()


def test_direct_inference(sagemaker):
    inputs = [
        {"name": n, "datatype": "INT32", "shape": [1, 16], "data": DATA[0].tolist()} for n in ("INPUT0", "INPUT1")
    ]
    status, headers, content = post(f"{sagemaker[1]}/invocations", json.dumps({"inputs": inputs}).encode(), {})
    assert status == 200, content
    answer = json.loads(content)
    assert answer["model_name"] == "addsub" and headers["Content-Type"] == "application/json"
    assert [o["data"] for o in answer["outputs"]] == [(DATA[0] * 2).tolist(), [0] * 16]


def test_a_binary_request_and_a_binary_answer_say_so_in_their_content_type(sagemaker):
    body, length = request_body(binary_input=True)
    status, _, content = post(f"{sagemaker[1]}/invocations", body, {"Content-Type": f"{MIME}{length}"})
    assert status == 200, content
    check(content)
    body, _ = request_body(binary_output=True)
    status, headers, content = post(f"{sagemaker[1]}/invocations", body, {"Content-Type": "application/json"})
    assert status == 200, content
    assert headers["Content-Type"].startswith(MIME) and headers.get("Inference-Header-Content-Length") is None
    check(content, int(headers["Content-Type"][len(MIME) :]))


@pytest.mark.parametrize(
    "content_type",
    [
        f"additional-string/{MIME}{{}}",
        f"{MIME}additional-string{{}}",
        f"{MIME}-123",
        f"{MIME}12345",
        f"{MIME}99999999999",
    ],
)
def test_a_malformed_binary_content_type_is_a_400_and_the_server_lives_on(sagemaker, content_type):
    body, length = request_body(binary_input=True)
    status, _, content = post(f"{sagemaker[1]}/invocations", body, {"Content-Type": content_type.format(length)})
    assert status == 400 and "error" in json.loads(content)
    assert urllib.request.urlopen(f"{sagemaker[1]}/ping", timeout=30).status == 200


def test_the_multi_model_api_outside_explicit_mode(sagemaker):
    """tritonserver registers no repository unless in explicit mode; Shoal's load answers with the
    load API's refusal. Nothing is listed, and the repository's own model is not a multi-model one."""
    url = addsub_repository(sagemaker[2] / "a1b2c3") / "addsub"
    url.rename(url.parent / "model")
    body = json.dumps({"model_name": "m", "url": str(url.parent / "model")}).encode()
    status, _, content = post(f"{sagemaker[1]}/models", body, {"Content-Type": "application/json"})
    assert status == 400 and json.loads(content) == {"error": NOT_EXPLICIT}
    status, _, content = post(f"{sagemaker[1]}/models", b"", {}, method="GET")
    assert status == 200 and json.loads(content) == {"models": []}
    assert post(f"{sagemaker[1]}/models/addsub/invoke", request_body()[0], {})[0] == 404


def test_an_unknown_inference_type_or_a_port_outside_the_safe_range_stops_the_start(monkeypatch):
    monkeypatch.delenv("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", raising=False)  # the module's serve sets it
    monkeypatch.setenv("SAGEMAKER_TRITON_INFERENCE_TYPE", "guess")
    with pytest.raises(SystemExit, match="Server has invalid inference type 'guess'. Must be one of: infer, generate"):
        parse_serve(["--allow-sagemaker=true"])
    monkeypatch.delenv("SAGEMAKER_TRITON_INFERENCE_TYPE")
    message = r"The server cannot listen to HTTP requests at port 8000, allowed port range is \[8081, 9000\]"
    with pytest.raises(SystemExit, match=message):
        parse_serve(["--allow-sagemaker=true", "--sagemaker-safe-port-range=8081-9000"])
    args = parse_serve(["--allow-sagemaker=true", "--sagemaker-safe-port-range=7000-9000"])
    assert (args.sagemaker_model, args.sagemaker_inference_type) == (
        "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME",
        "infer",
    )
