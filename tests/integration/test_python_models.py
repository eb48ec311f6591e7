"""Python-backend features beyond execute: BLS, decoupled models over the generate extension,
auto_complete_config, is_ready and is_cancelled, against the real services."""

from __future__ import annotations

import http.client
import json
import textwrap
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from services.repository import examples
from tests.cluster import running_cluster
from tests.serving import wait_until

SIMPLE_IO = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

BLS_SYNC = """
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = json.loads(request.parameters()).get("target", "simple")
            inputs = [pb_utils.get_input_tensor_by_name(request, n) for n in ("INPUT0", "INPUT1")]
            answer = pb_utils.InferenceRequest(model_name=target, inputs=inputs,
                                               requested_output_names=["OUTPUT0", "OUTPUT1"]).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.get_output_tensor_by_name(answer, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(answer, "OUTPUT1")]))
        return responses
"""

BLS_ASYNC = """
import asyncio
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            forward = pb_utils.InferenceRequest(model_name="simple", inputs=[a, b], requested_output_names=["OUTPUT0"])
            swapped = pb_utils.InferenceRequest(
                model_name="simple", requested_output_names=["OUTPUT1"],
                inputs=[pb_utils.Tensor("INPUT0", b.as_numpy()), pb_utils.Tensor("INPUT1", a.as_numpy())])
            one, two = await asyncio.gather(forward.async_exec(), swapped.async_exec())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.get_output_tensor_by_name(one, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(two, "OUTPUT1")]))
        return responses
"""

REPEAT_CONFIG = """
name: "repeat"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
model_warmup [ { name: "w" batch_size: 1 inputs { key: "IN" value: { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true } } } ]
"""

REPEAT = """
import json
import os
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dir = pb_utils.get_model_dir()

    def execute(self, requests):
        for request in requests:  # answered from threads, after execute returned
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            params = json.loads(request.parameters())
            threading.Thread(target=self.stream, args=(request, values, params), daemon=True).start()
        return None

    def stream(self, request, values, params):
        sender = request.get_response_sender()
        for i, value in enumerate(values):
            if sender.is_cancelled():
                open(os.path.join(self.dir, "cancelled-" + request.request_id()), "w").close()
                return
            if params.get("fail_at") == i:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"failed at {i}")),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.array([value], np.int32)), pb_utils.Tensor("IDX", np.array([i], np.uint32))]))
            time.sleep(params.get("delay", 0))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

BLS_STREAM = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN")
            total = 0
            for answer in pb_utils.InferenceRequest(model_name="repeat", inputs=[values],
                                                    requested_output_names=["OUT"]).exec(decoupled=True):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                if answer.output_tensors():
                    total += int(pb_utils.get_output_tensor_by_name(answer, "OUT").as_numpy()[0])
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", np.array([total], np.int32))]))
        return responses
"""

BLS_STREAM_CONFIG = """
name: "bls_stream"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

AUTO = """
import triton_python_backend_utils as pb_utils

print("importing the auto model")  # models print; auto-complete must not read this as its result


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        config.set_max_batch_size(4)
        config.set_dynamic_batching()
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)]) for r in requests]
"""

FLAKY_READY = """
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.flag = os.path.join(pb_utils.get_model_dir(), "..", "not_ready")

    def is_ready(self):
        return not os.path.exists(self.flag)

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""

CRASHER = """
import ctypes
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        if any(json.loads(r.parameters()).get("crash") for r in requests):
            ctypes.string_at(0)  # a segfault: the interpreter dies, not just this call
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""

ASYNC_REPEAT = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:  # answered by tasks that outlive execute
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            asyncio.get_running_loop().create_task(self.stream(request.get_response_sender(), values))
        return None

    async def stream(self, sender, values):
        for i, value in enumerate(values):
            await asyncio.sleep(0.01)
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.array([value], np.int32)), pb_utils.Tensor("IDX", np.array([i], np.uint32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

LOAD_CRASHER = """
import ctypes


class TritonPythonModel:
    def initialize(self, args):
        ctypes.string_at(0)

    def execute(self, requests):
        return []
"""

METERED = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.requests = pb_utils.MetricFamily("custom_requests_total", "Requests seen by the model",
                                              pb_utils.MetricFamily.COUNTER).Metric(labels={"model": args["model_name"]})
        self.sizes = pb_utils.MetricFamily("custom_input_sum", "Sum of each request's input",
                                           pb_utils.MetricFamily.HISTOGRAM).Metric(buckets=[1, 10])

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            self.requests.increment(1)
            self.sizes.observe(float(value.sum()))
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", value)]))
        return responses
"""

FP32_IO = """
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _python_model(root: Path, name: str, source: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(source))
    (root / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("python_models")
    examples.write_model(root, "simple", examples.simple_graph(), examples.SIMPLE_CONFIG)
    _python_model(root, "bls_sync", BLS_SYNC, f'name: "bls_sync"\nbackend: "python"\n{SIMPLE_IO}')
    _python_model(root, "bls_async", BLS_ASYNC, f'name: "bls_async"\nbackend: "python"\n{SIMPLE_IO}')
    _python_model(root, "repeat", REPEAT, REPEAT_CONFIG)
    _python_model(root, "bls_stream", BLS_STREAM, BLS_STREAM_CONFIG)
    _python_model(root, "auto", AUTO, 'backend: "python"\n')
    _python_model(root, "flaky_ready", FLAKY_READY, f'name: "flaky_ready"\nbackend: "python"\n{FP32_IO}')
    _python_model(root, "crasher", CRASHER, f'name: "crasher"\nbackend: "python"\n{FP32_IO}')
    _python_model(root, "async_repeat", ASYNC_REPEAT, REPEAT_CONFIG.replace('"repeat"', '"async_repeat"'))
    _python_model(root, "metered", METERED, f'name: "metered"\nbackend: "python"\n{FP32_IO}')
    _python_model(root, "load_crasher", LOAD_CRASHER, f'name: "load_crasher"\nbackend: "python"\n{FP32_IO}')
    with running_cluster(root) as running:
        running.root = root
        yield running


def simple_inputs(a: np.ndarray, b: np.ndarray) -> list[httpclient.InferInput]:
    tensors = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        tensor = httpclient.InferInput(name, list(value.shape), "INT32")
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    return tensors


def post(url: str, path: str, body: dict, timeout: float = 30) -> tuple[int, dict, bytes]:
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def events(body: bytes) -> list[dict]:
    return [json.loads(chunk[len(b"data: ") :]) for chunk in body.split(b"\n\n") if chunk.startswith(b"data: ")]


def test_bls_calls_an_onnx_model_through_the_scheduler(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.ones((2, 16), np.int32)
    for model in ("bls_sync", "bls_async"):
        result = client.infer(model, simple_inputs(a, b))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(client.infer("bls_sync", simple_inputs(a, b)).as_numpy("OUTPUT1"), a - b)
    np.testing.assert_array_equal(client.infer("bls_async", simple_inputs(a, b)).as_numpy("OUTPUT1"), b - a)
    stats = client.get_inference_statistics("simple")["model_stats"][0]["inference_stats"]
    assert stats["success"]["count"] >= 5  # the BLS requests went through simple's own scheduler
    client.close()


def test_bls_error_reaches_the_calling_model(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    a = np.ones((1, 16), np.int32)
    with pytest.raises(InferenceServerException) as err:
        client.infer("bls_sync", simple_inputs(a, a), parameters={"target": "no_such_model"})
    assert err.value.status() == "404"
    assert err.value.message() == "Request for unknown model: 'no_such_model' is not found"
    np.testing.assert_array_equal(client.infer("bls_sync", simple_inputs(a, a)).as_numpy("OUTPUT0"), 2 * a)
    client.close()


def test_decoupled_model_streams_over_sse(cluster):
    status, headers, body = post(cluster.url, "/v2/models/repeat/generate_stream", {"IN": [4, 5, 6], "id": "r1"})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert events(body) == [
        {"id": "r1", "model_name": "repeat", "model_version": "1", "OUT": v, "IDX": i} for i, v in enumerate([4, 5, 6])
    ]


def test_async_decoupled_model_answers_from_its_tasks(cluster):
    status, _, body = post(cluster.url, "/v2/models/async_repeat/generate_stream", {"IN": [1, 2]})
    assert status == 200
    assert [e["OUT"] for e in events(body)] == [1, 2]


def test_a_python_model_crashing_while_loading_fails_its_load(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["load_crasher"]["state"] == "UNAVAILABLE"
    assert (
        index["load_crasher"]["reason"]
        == "the process of python model 'load_crasher' exited with code -11 while loading it"
    )
    client.close()


def test_decoupled_errors(cluster):
    status, _, body = post(cluster.url, "/v2/models/repeat/generate_stream", {"IN": [4, 5, 6], "fail_at": 1})
    assert status == 200
    assert events(body) == [
        {"model_name": "repeat", "model_version": "1", "OUT": 4, "IDX": 0},
        {"error": "failed at 1"},
    ]
    status, _, body = post(cluster.url, "/v2/models/repeat/generate_stream", {"IN": [4], "fail_at": 0})
    assert (status, json.loads(body)) == (500, {"error": "failed at 0"})  # before any response: a plain error
    status, _, body = post(cluster.url, "/v2/models/repeat/generate", {"IN": [4, 5]})
    assert status == 400 and "exactly one response" in json.loads(body)["error"]
    status, _, body = post(cluster.url, "/v2/models/repeat/generate", {"IN": [7]})
    assert (status, json.loads(body)) == (200, {"model_name": "repeat", "model_version": "1", "OUT": 7, "IDX": 0})
    client = httpclient.InferenceServerClient(cluster.url)
    with pytest.raises(InferenceServerException) as err:
        client.infer("repeat", [httpclient.InferInput("IN", [1], "INT32").set_data_from_numpy(np.ones(1, np.int32))])
    assert err.value.message() == "HTTP end point doesn't support models with decoupled transaction policy"
    client.close()


def test_generate_on_an_ordinary_model(cluster):
    status, _, body = post(cluster.url, "/v2/models/auto/generate", {"INPUT0": [1, 2, 3, 4], "id": "g"})
    assert (status, json.loads(body)) == (
        200,
        {"id": "g", "model_name": "auto", "model_version": "1", "OUTPUT0": [2.0, 4.0, 6.0, 8.0]},
    )
    status, _, body = post(cluster.url, "/v2/models/auto/generate", {"INPUT0": ["x", 2, 3, 4]})
    assert (status, json.loads(body)) == (
        500,
        {"error": "Unable to parse 'data': attempt to access JSON non-number as double"},
    )
    status, _, body = post(
        cluster.url, "/v2/models/auto/generate", {"INPUT0": [1, 2, 3, 4], "parameters": {"INPUT0": 3}}
    )
    assert status == 400 and "both as a top-level key and in 'parameters'" in json.loads(body)["error"]


def test_bls_reads_a_decoupled_stream(cluster):
    status, _, body = post(cluster.url, "/v2/models/bls_stream/generate", {"IN": [1, 2, 3, 4]})
    assert (status, json.loads(body).get("SUM")) == (200, 10), body


def test_client_disconnect_reaches_is_cancelled(cluster):
    host, port = cluster.url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(
        "POST",
        "/v2/models/repeat/generate_stream",
        json.dumps({"IN": list(range(100)), "delay": 0.05, "id": "gone"}),
        {"Content-Type": "application/json"},
    )
    response = conn.getresponse()
    assert response.status == 200
    assert response.read(6) == b"data: "  # the stream has started
    conn.sock.close()
    conn.close()
    marker = cluster.root / "repeat" / "1" / "cancelled-gone"
    wait_until(marker.exists, 10, "the model seeing is_cancelled()", 0.05)


def test_custom_metrics_reach_the_metrics_endpoint(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    for value in (0.1, 2.0):
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.full((1, 4), value, np.float32))
        client.infer("metered", [tensor])
    client.close()

    def scrape() -> str:
        with urllib.request.urlopen(cluster.metrics_url, timeout=10) as response:
            return response.read().decode()

    # workers publish them with their heartbeats
    wait_until(lambda: 'custom_requests_total{model="metered"} 2' in scrape(), 10, "the custom metrics", detail=scrape)
    text = scrape()
    assert "# TYPE custom_requests_total counter" in text
    assert 'custom_requests_total{model="metered"} 2' in text
    assert 'custom_input_sum_bucket{le="1"} 1' in text and 'custom_input_sum_bucket{le="10"} 2' in text
    assert "custom_input_sum_count{} 2" in text and "custom_input_sum_sum{} 8.4" in text


def test_auto_complete_config(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    config = client.get_model_config("auto")
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("INPUT0", "TYPE_FP32", [4])]
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    np.testing.assert_array_equal(client.infer("auto", [tensor]).as_numpy("OUTPUT0"), np.full((1, 4), 2, np.float32))
    client.close()


def test_is_ready_drives_model_readiness(cluster):
    client = httpclient.InferenceServerClient(cluster.url)
    flag = cluster.root / "flaky_ready" / "not_ready"

    def wait(expected: bool) -> bool:
        wait_until(lambda: client.is_model_ready("flaky_ready") == expected, 15, f"ready {expected}")
        return True

    assert wait(True)
    flag.touch()
    try:
        assert not client.is_model_ready("flaky_ready")  # asked on the request itself, as Triton's
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["flaky_ready"]["state"] == "READY"  # the model's state is not the check's
    finally:
        flag.unlink()
    assert client.is_model_ready("flaky_ready")
    client.close()


def test_a_crashing_python_model_takes_down_only_itself(cluster):
    client = httpclient.InferenceServerClient(cluster.url, network_timeout=60)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("crasher", [tensor], parameters={"crash": True})
    assert err.value.status() == "503" and "stopped responding" in err.value.message()
    a = np.ones((1, 16), np.int32)  # the other models, python ones included, never stopped
    np.testing.assert_array_equal(client.infer("bls_sync", simple_inputs(a, a)).as_numpy("OUTPUT0"), 2 * a)
    np.testing.assert_array_equal(client.infer("auto", [tensor]).as_numpy("OUTPUT0"), 2 * np.ones((1, 4)))
    # its process is restarted and the model loads again
    wait_until(
        lambda: client.infer("crasher", [tensor]), 30, "the crashed python model back", 0.2, (InferenceServerException,)
    )
    np.testing.assert_array_equal(client.infer("crasher", [tensor]).as_numpy("OUTPUT0"), np.ones((1, 4)))
    client.close()


CONTROLLER = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            action = json.loads(request.parameters())["action"]
            if action == "load":
                pb_utils.load_model("simple")
            elif action == "unload":
                pb_utils.unload_model("simple")
            ready = pb_utils.is_model_ready("simple")
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", np.full((1, 4), float(ready), np.float32))]))
        return responses
"""


def test_a_python_model_loads_and_unloads_models(tmp_path):
    examples.write_model(tmp_path, "simple", examples.simple_graph(), examples.SIMPLE_CONFIG)
    _python_model(tmp_path, "controller", CONTROLLER, f'name: "controller"\nbackend: "python"\n{FP32_IO}')
    with running_cluster(
        tmp_path, repository={"model_control_mode": "explicit", "load_model": ["controller"]}
    ) as running:
        client = httpclient.InferenceServerClient(running.url)
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 4), np.float32))

        def act(action: str) -> float:
            return float(client.infer("controller", [tensor], parameters={"action": action}).as_numpy("OUTPUT0")[0, 0])

        assert not client.is_model_ready("simple") and act("check") == 0.0
        assert act("load") == 1.0 and client.is_model_ready("simple")
        assert act("unload") == 0.0 and not client.is_model_ready("simple")
        client.close()
