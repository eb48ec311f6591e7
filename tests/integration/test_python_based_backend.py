"""A python-based backend (`backend: "fakellm"` served by `<backend-directory>/fakellm/model.py`)
with the shape of Triton's vLLM backend, through the real system and tritonclient: its
auto_complete_config completes a config that names only the backend, model.json is read from
the model's version directory, responses stream through gRPC, a cancelled stream reaches
`is_cancelled`, and its MetricFamily metrics reach `/metrics`."""

from __future__ import annotations

import json
import queue
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.cluster import Running, running_cluster
from tests.serving import wait_until

BACKEND = Path(__file__).parent / "python_based" / "fakellm"

CONFIG = """
backend: "fakellm"
instance_group [ { count: 1 kind: KIND_MODEL } ]
parameters { key: "REPORT_CUSTOM_METRICS" value: { string_value: "true" } }
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Running:
    root = tmp_path_factory.mktemp("python_based")
    backends = root / "backends"
    shutil.copytree(BACKEND, backends / "fakellm")
    models = root / "models"
    (models / "fakellm_model" / "1").mkdir(parents=True)
    (models / "fakellm_model" / "config.pbtxt").write_text(CONFIG)
    (models / "fakellm_model" / "1" / "model.json").write_text(json.dumps({"step_delay_s": 0.005}))
    # an unhealthy engine: the backend answers UNAVAILABLE and unloads its model (vLLM's health check)
    (models / "fakellm_sick" / "1").mkdir(parents=True)
    (models / "fakellm_sick" / "config.pbtxt").write_text(
        CONFIG.replace("REPORT_CUSTOM_METRICS", "ENABLE_HEALTH_CHECK")
    )
    (models / "fakellm_sick" / "1" / "model.json").write_text(json.dumps({"healthy": False}))
    # a backend no directory has: unavailable with a clear reason, the rest still loads
    (models / "nowhere" / "1").mkdir(parents=True)
    (models / "nowhere" / "config.pbtxt").write_text(
        'backend: "nowhere"\nmax_batch_size: 0\n'
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "B" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    settings = {"backend_directory": str(backends), "backend_config": ["fakellm,shm-default-byte-size=4194304"]}
    control = {"model_control_mode": "explicit", "load_model": ["*"]}  # a model may unload itself
    with running_cluster(models, worker=settings, repository={**settings, **control}) as running:
        http = httpclient.InferenceServerClient(running.url)
        wait_until(
            lambda: http.is_model_ready("fakellm_model") and http.is_model_ready("fakellm_sick"),
            90,
            "both models ready",
            0.2,
            detail=http.get_model_repository_index,
        )
        yield running


def test_auto_complete_config_of_the_backend_completes_the_model(served):
    http = httpclient.InferenceServerClient(served.url)
    config = http.get_model_config("fakellm_model")
    assert config["model_transaction_policy"] == {"decoupled": True}
    assert config["max_batch_size"] == 0
    assert [i["name"] for i in config["input"]] == ["text_input", "stream", "sampling_parameters"]
    assert http.get_model_metadata("fakellm_model")["platform"] == "fakellm"


def test_an_unknown_backend_says_where_it_looked(served):
    index = {m["name"]: m for m in httpclient.InferenceServerClient(served.url).get_model_repository_index()}
    assert index["nowhere"]["state"] == "UNAVAILABLE"
    assert "backend 'nowhere' is not supported" in index["nowhere"]["reason"]
    assert "nowhere/model.py" in index["nowhere"]["reason"]


def inputs(text: str, stream: bool, max_tokens: int) -> list[grpcclient.InferInput]:
    prompt = grpcclient.InferInput("text_input", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([text.encode()], dtype=object))
    flag = grpcclient.InferInput("stream", [1], "BOOL")
    flag.set_data_from_numpy(np.array([stream]))
    params = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    params.set_data_from_numpy(np.array([json.dumps({"max_tokens": max_tokens}).encode()], dtype=object))
    return [prompt, flag, params]


class Stream:
    def __init__(self, url: str) -> None:
        self.results: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def until_final(self) -> list:
        got = []
        while True:
            result, error = self.results.get(timeout=30)
            got.append((result, error))
            if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                return got

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def test_streamed_and_whole_generations(served):
    stream = Stream(served.grpc_url)
    try:
        stream.client.async_stream_infer("fakellm_model", inputs("a b", True, 3))
        words = [r.as_numpy("text_output")[0] for r, e in stream.until_final() if e is None]
        assert words == [b"A", b"B", b"A"]
        stream.client.async_stream_infer("fakellm_model", inputs("x y z", False, 5))
        ((whole, error),) = stream.until_final()
        assert error is None
        assert whole.as_numpy("text_output")[0] == b"X Y Z X Y" and whole.as_numpy("num_output_tokens")[0] == 5
    finally:
        stream.close()


def scrape(served: Running) -> str:
    with urllib.request.urlopen(served.metrics_url, timeout=10) as response:
        return response.read().decode()


def test_a_cancelled_stream_reaches_is_cancelled_and_the_metrics_show(served):
    stream = Stream(served.grpc_url)
    stream.client.async_stream_infer("fakellm_model", inputs("long", True, 2000))  # ~10 s of tokens
    first, error = stream.results.get(timeout=30)
    assert error is None and first.as_numpy("text_output")[0] == b"LONG"
    stream.close(cancel=True)
    labels = '{model="fakellm_model",version="1"}'
    wait_until(
        lambda: f"fakellm:cancelled_requests_total{labels} 1" in scrape(served),
        30,
        "the cancelled request counted",
        0.3,
        detail=lambda: scrape(served)[-3000:],
    )
    text = scrape(served)
    assert "# TYPE fakellm:generation_tokens_total counter" in text
    assert "fakellm:request_generation_tokens_bucket{" in text


def test_an_unhealthy_backend_answers_unavailable_and_unloads_its_model(served):
    stream = Stream(served.grpc_url)
    try:
        stream.client.async_stream_infer("fakellm_sick", inputs("a", True, 2))
        ((result, error),) = stream.until_final()
        assert error is not None and "Model is unavailable due to unhealthy engine" in str(error)
    finally:
        stream.close()
    http = httpclient.InferenceServerClient(served.url)
    # pb_utils.unload_model from its own execute, not waited on
    wait_until(lambda: not http.is_model_ready("fakellm_sick"), 30, "the sick model unloaded", 0.2)
    assert http.is_model_ready("fakellm_model")


def test_perf_analyzer_streams_from_the_python_based_backend(perf_analyzer, served, tmp_path):
    from tests.integration.test_perf_analyzer import run as perf_run

    binary = perf_analyzer
    data = tmp_path / "prompt.json"
    data.write_text(
        json.dumps({"data": [{"text_input": ["a b"], "stream": [True], "sampling_parameters": ['{"max_tokens": 3}']}]})
    )
    perf_run(
        binary,
        served.grpc_url,
        "-i",
        "grpc",
        "--streaming",
        "-m",
        "fakellm_model",
        "--input-data",
        str(data),
        "--concurrency-range",
        "2",
    )
