"""shoal.pytriton in this test process: `Triton()` starts the embedded cluster (nats-server and
the services as processes), this process serves the bound functions; driven with tritonclient,
ModelClient and curl."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shared.process.natsserver import free_port
from shoal.pytriton.client import AsyncioModelClient, DecoupledModelClient, FuturesModelClient, ModelClient
from shoal.pytriton.client.exceptions import PyTritonClientClosedError, PyTritonClientInferenceServerError
from shoal.pytriton.decorators import batch
from shoal.pytriton.exceptions import PyTritonUnrecoverableError, PyTritonValidationError
from shoal.pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from shoal.pytriton.triton import Triton, TritonConfig
from tests.serving import wait_until

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


@batch
def countdown(n: np.ndarray):
    """Decoupled: n, n-1, ..., 1 (one response each), then fails if n was 13."""
    for step in range(int(n.max()), 0, -1):
        yield {"left": np.full_like(n, step)}
    if int(n.max()) == 13:
        raise PyTritonValidationError("unlucky number")


MEETING = threading.Barrier(2)


def meet(requests):
    """Each instance's call waits for the other's: they run at once, each on its instance's thread."""
    MEETING.wait(timeout=30)
    return [{"y": np.array([threading.get_ident()], np.int64)} for _ in requests]


def doomed(requests):
    raise PyTritonUnrecoverableError("the device is gone")


def free_ports_config() -> TritonConfig:
    """Every endpoint on a free port (several clusters run at once on a test machine)."""
    return TritonConfig(
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        http_address="127.0.0.1",
        grpc_address="127.0.0.1",
    )


@pytest.fixture(scope="module")
def triton():
    config = free_ports_config()
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
        meeting = ([Tensor(name="x", dtype=np.float32, shape=(1,))], [Tensor(name="y", dtype=np.int64, shape=(1,))])
        triton.bind("Meet", [meet, meet], *meeting, config=ModelConfig(batching=False))
        triton.bind(
            "Countdown",
            countdown,
            [Tensor(name="n", dtype=np.int32, shape=(1,))],
            [Tensor(name="left", dtype=np.int32, shape=(1,))],
            config=ModelConfig(max_batch_size=8, decoupled=True),
        )
        yield Served(triton, config.http_port, config.grpc_port)


class Served(NamedTuple):
    triton: Triton
    port: int
    grpc_port: int

    @property
    def urls(self) -> dict[str, str]:
        return {"http": f"http://127.0.0.1:{self.port}", "grpc": f"grpc://127.0.0.1:{self.grpc_port}"}


@pytest.fixture
def http(triton):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{triton[1]}", network_timeout=60)
    yield client
    client.close()


def _input(name: str, array: np.ndarray, datatype: str) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def test_the_instances_of_a_bound_function_run_at_once(triton):
    """Two instances (a list of two callables) take two requests at the same time, each on its own
    thread of this process (PyTriton runs them in the script's process too)."""

    def call() -> int:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{triton.port}", network_timeout=60)
        try:
            result = client.infer("Meet", [_input("x", np.zeros(1, np.float32), "FP32")])
            return int(result.as_numpy("y")[0])
        finally:
            client.close()

    with ThreadPoolExecutor(2) as pool:
        threads = list(pool.map(lambda _: call(), range(2)))
    assert len(set(threads)) == 2, threads  # both met: neither waited for the other to finish


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


def test_model_client_over_grpc(triton):
    with ModelClient(triton.urls["grpc"], "Double", init_timeout_s=30) as client:
        assert client.model_config.max_batch_size == 4
        assert client.infer_sample(np.array([1.0, 2.0], np.float32))["OUTPUT_1"].tolist() == [2.0, 4.0]
        assert client.infer_batch(np.ones((3, 2), np.float32))["OUTPUT_1"].tolist() == [[2.0, 2.0]] * 3
    with ModelClient(triton.urls["grpc"], "Validate", init_timeout_s=30) as client:
        assert client.infer_sample(x=np.array([3, 4], np.int32))["y"].tolist() == [3, 4]
        with pytest.raises(PyTritonClientInferenceServerError, match="x must not be negative"):
            client.infer_sample(x=np.array([-5, 1], np.int32))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_decoupled_model_client_streams_a_generator(triton, protocol):
    with DecoupledModelClient(triton.urls[protocol], "Countdown", init_timeout_s=30) as client:
        assert [r["left"].tolist() for r in client.infer_sample(n=np.array([3], np.int32))] == [[3], [2], [1]]
        assert [r["left"].tolist() for r in client.infer_sample(n=np.array([1], np.int32))] == [[1]]
        answers = []
        with pytest.raises(PyTritonClientInferenceServerError, match="unlucky number"):
            for response in client.infer_sample(n=np.array([13], np.int32)):
                answers.append(int(response["left"][0]))
        assert answers == list(range(13, 0, -1))  # every response before the error arrived
        if protocol == "grpc":  # a batch over a stream (HTTP's /generate_stream takes one sample)
            batch_answers = list(client.infer_batch(n=np.array([[2], [2]], np.int32)))
            assert [r["left"].tolist() for r in batch_answers] == [[[2], [2]], [[1], [1]]]
    with ModelClient(triton.urls[protocol], "Countdown", init_timeout_s=30) as coupled:
        with pytest.raises(PyTritonClientInferenceServerError, match="decoupled"):
            coupled.infer_sample(n=np.array([2], np.int32))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_asyncio_model_client(triton, protocol):
    async def run() -> None:
        async with AsyncioModelClient(triton.urls[protocol], "Double", init_timeout_s=30) as client:
            assert (await client.model_config).max_batch_size == 4
            samples = await asyncio.gather(
                *(client.infer_sample(np.full(2, i, np.float32)) for i in range(6))
            )  # concurrent requests on one client
            assert [r["OUTPUT_1"].tolist() for r in samples] == [[2.0 * i, 2.0 * i] for i in range(6)]
            assert (await client.infer_batch(np.ones((3, 2), np.float32)))["OUTPUT_1"].shape == (3, 2)
        async with AsyncioModelClient(triton.urls[protocol], "Validate", init_timeout_s=30) as client:
            with pytest.raises(PyTritonClientInferenceServerError, match="x must not be negative"):
                await client.infer_sample(x=np.array([-1, 1], np.int32))

    asyncio.run(run())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_futures_model_client(triton, protocol):
    with FuturesModelClient(triton.urls[protocol], "Double", max_workers=4, init_timeout_s=30) as client:
        assert client.model_config().result(60).max_batch_size == 4
        futures = [client.infer_sample(np.full(2, i, np.float32)) for i in range(12)]
        assert [f.result(60)["OUTPUT_1"].tolist() for f in futures] == [[2.0 * i, 2.0 * i] for i in range(12)]
        assert client.infer_batch(np.ones((2, 2), np.float32)).result(60)["OUTPUT_1"].tolist() == [[2.0, 2.0]] * 2
    with FuturesModelClient(triton.urls[protocol], "Validate", init_timeout_s=30) as client:
        with pytest.raises(PyTritonClientInferenceServerError, match="x must not be negative"):
            client.infer_sample(x=np.array([-1, 1], np.int32)).result(60)
    with pytest.raises(PyTritonClientClosedError):
        client.infer_sample(x=np.array([1, 1], np.int32))


def test_unrecoverable_error_stops_serving():
    config = free_ports_config()
    port = config.http_port
    triton = Triton(config=config)
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
    wait_until(lambda: not triton.is_alive(), 60, "the Triton thread's end")
    served.join(60)
    assert not served.is_alive()
