"""shoal.pytriton in this test process: `Triton()` starts the embedded cluster (nats-server and
the services as processes), this process serves the bound functions; driven with tritonclient,
ModelClient and curl."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shared.natsserver import free_port
from shoal.pytriton.client import ModelClient
from shoal.pytriton.client.exceptions import PyTritonClientInferenceServerError
from shoal.pytriton.decorators import batch
from shoal.pytriton.exceptions import PyTritonUnrecoverableError, PyTritonValidationError
from shoal.pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from shoal.pytriton.triton import Triton, TritonConfig

CALLS = {"double": 0, "validate": 0}


@batch
def double(**inputs: np.ndarray):
    CALLS["double"] += 1
    (x,) = inputs.values()
    return [x * 2]


def validate(requests):
    CALLS["validate"] += 1
    out = []
    for request in requests:
        if request["x"].min() < 0:
            raise PyTritonValidationError("x must not be negative")
        if request["x"].max() > 1000:
            raise ValueError("too large")
        out.append({"y": request["x"]})
    return out


def doomed(requests):
    raise PyTritonUnrecoverableError("the device is gone")


@pytest.fixture(scope="module")
def triton():
    config = TritonConfig(http_port=free_port(), metrics_port=free_port(), http_address="127.0.0.1")
    with Triton(config=config) as triton:
        floats = [Tensor(dtype=np.float32, shape=(-1,))]
        # PyTriton's defaults: max_batch_size 4, batching, default tensor names
        triton.bind("Double", [double, double], floats, floats)
        triton.bind(
            "Slow",
            double,
            floats,
            floats,
            config=ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=500_000)),
        )
        named = ([Tensor(name="x", dtype=np.int32, shape=(2,))], [Tensor(name="y", dtype=np.int32, shape=(2,))])
        triton.bind("Validate", validate, *named)
        yield triton, config.http_port


@pytest.fixture
def http(triton):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{triton[1]}", network_timeout=60)
    yield client
    client.close()


def _input(name: str, array: np.ndarray, datatype: str) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def test_generated_config_is_pytritons(http):
    config = http.get_model_config("Double")
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 4
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("INPUT_1", "TYPE_FP32", [-1])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [("OUTPUT_1", "TYPE_FP32", [-1])]
    assert [(g["count"], g["kind"]) for g in config["instance_group"]] == [(2, "KIND_CPU")]  # one per function
    assert "dynamic_batching" in config
    assert config["parameters"]["shoal-in-process"]["string_value"].startswith("pytriton")


def test_model_client_and_tritonclient(triton, http):
    with ModelClient(f"127.0.0.1:{triton[1]}", "Double", init_timeout_s=30) as client:
        result = client.infer_sample(np.array([1.0, 2.0], dtype=np.float32))
        assert result["OUTPUT_1"].tolist() == [2.0, 4.0]
        batch_result = client.infer_batch(np.ones((3, 2), dtype=np.float32))
        assert batch_result["OUTPUT_1"].shape == (3, 2)
    answer = http.infer("Double", [_input("INPUT_1", np.full((1, 3), 3, np.float32), "FP32")])
    assert answer.as_numpy("OUTPUT_1").tolist() == [[6.0, 6.0, 6.0]]


def test_curl_infer(triton):
    body = {"inputs": [{"name": "INPUT_1", "shape": [1, 2], "datatype": "FP32", "data": [1.5, 2.5]}]}
    out = subprocess.run(
        ["curl", "-s", "-d", json.dumps(body), f"http://127.0.0.1:{triton[1]}/v2/models/Double/infer"],
        capture_output=True,
        check=True,
        timeout=60,
    )
    assert json.loads(out.stdout)["outputs"][0]["data"] == [3.0, 5.0]


def test_batch_groups_concurrent_single_requests(triton, http):
    before = http.get_inference_statistics("Slow")["model_stats"][0]

    def one(i: int) -> list[float]:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{triton[1]}", network_timeout=60)
        try:
            answer = client.infer("Slow", [_input("INPUT_1", np.full((1, 2), i, np.float32), "FP32")])
            return answer.as_numpy("OUTPUT_1").tolist()
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    assert results == [[[2.0 * i, 2.0 * i]] for i in range(8)]
    after = http.get_inference_statistics("Slow")["model_stats"][0]
    requests = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert requests == 8
    assert executions < requests  # the function saw batches of several requests


def test_validation_error_is_400_and_other_errors_500(http):
    with pytest.raises(InferenceServerException) as bad:
        http.infer("Validate", [_input("x", np.array([[-1, 2]], np.int32), "INT32")])
    assert bad.value.status() == "400"
    assert "x must not be negative" in bad.value.message()
    with pytest.raises(InferenceServerException) as failed:
        http.infer("Validate", [_input("x", np.array([[1, 2000]], np.int32), "INT32")])
    assert failed.value.status() == "500"
    assert "ValueError: too large" in failed.value.message()


def test_wrong_dtype_or_shape_is_refused_before_the_function(http):
    calls = CALLS["validate"]
    with pytest.raises(InferenceServerException) as dtype:
        http.infer("Validate", [_input("x", np.array([[1.0, 2.0]], np.float32), "FP32")])
    assert dtype.value.status() == "400"
    assert "data-type is 'FP32', but model 'Validate' expects 'INT32'" in dtype.value.message()
    with pytest.raises(InferenceServerException) as shape:
        http.infer("Validate", [_input("x", np.array([[1, 2, 3]], np.int32), "INT32")])
    assert shape.value.status() == "400"
    assert "unexpected shape for input 'x'" in shape.value.message()
    assert CALLS["validate"] == calls


def test_model_client_reports_server_errors(triton):
    with ModelClient(f"127.0.0.1:{triton[1]}", "Validate", init_timeout_s=30) as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="x must not be negative"):
            client.infer_sample(np.array([-5, 1], dtype=np.int32))


def test_unrecoverable_error_stops_serving():
    port = free_port()
    triton = Triton(config=TritonConfig(http_port=port, metrics_port=free_port(), http_address="127.0.0.1"))
    triton.bind("Doomed", doomed, [Tensor(dtype=np.float32, shape=(-1,))], [Tensor(dtype=np.float32, shape=(-1,))])
    triton.run()
    served = threading.Thread(target=triton.serve, daemon=True)  # returns once the error stopped it
    served.start()
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
    try:
        with pytest.raises(InferenceServerException, match="the device is gone"):
            client.infer("Doomed", [_input("INPUT_1", np.ones((1, 1), np.float32), "FP32")])
    finally:
        client.close()
    deadline = time.monotonic() + 60
    while triton.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not triton.is_alive()
    served.join(60)
    assert not served.is_alive()
