"""Ensembles with a decoupled step (preprocess -> generator -> postprocess), streamed over SSE,
against the real services."""

from __future__ import annotations

import glob
import http.client
import json
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.cluster import running_cluster

PRE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)]) for r in requests]
'''

# answers from a thread, one response per prompt value: TOKEN = 10 * value, IDX = i and a
# BLOB of `blob` floats (large ones go through shared memory)
GEN = '''
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
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()
            params = json.loads(request.parameters())
            threading.Thread(target=self.stream, args=(request, prompt, params), daemon=True).start()
        return None

    def stream(self, request, prompt, params):
        sender = request.get_response_sender()
        for i, value in enumerate(prompt):
            if sender.is_cancelled():
                open(os.path.join(self.dir, "cancelled-" + request.request_id()), "w").close()
                return
            if params.get("fail_at") == i:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"failed at {i}")),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("TOKEN", np.array([value * 10], np.int32)),
                pb_utils.Tensor("IDX", np.array([i], np.uint32)),
                pb_utils.Tensor("BLOB", np.full(params.get("blob", 1), i, np.float32))]))
            time.sleep(params.get("delay", 0))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

# reads the iteration's token and blob together with the preprocess output (upstream)
POST = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            token = pb_utils.get_input_tensor_by_name(r, "TOKEN").as_numpy()
            prompt = pb_utils.get_input_tensor_by_name(r, "PROMPT").as_numpy()
            blob = pb_utils.get_input_tensor_by_name(r, "BLOB").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", (token + 1000 * len(prompt)).astype(np.int32)),
                pb_utils.Tensor("SUM", np.array([blob.sum()], np.float32))]))
        return responses
'''


def _python(name: str, inputs: str, outputs: str, extra: str = "") -> str:
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\ninput [ {inputs} ]\noutput [ {outputs} ]\n'
            f"instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n{extra}")


def _ensemble(name: str, extra: str = "") -> str:
    return f'''
name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }},
         {{ name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }} ]
ensemble_scheduling {{
  {extra}
  step [ {{ model_name: "pre" model_version: -1 input_map {{ key: "X" value: "IN" }} output_map {{ key: "Y" value: "prompt" }} }} ]
  step [ {{ model_name: "gen" model_version: -1 input_map {{ key: "PROMPT" value: "prompt" }}
           output_map {{ key: "TOKEN" value: "token" }} output_map {{ key: "IDX" value: "IDX" }}
           output_map {{ key: "BLOB" value: "blob" }} }} ]
  step [ {{ model_name: "post" model_version: -1
           input_map {{ key: "TOKEN" value: "token" }} input_map {{ key: "PROMPT" value: "prompt" }}
           input_map {{ key: "BLOB" value: "blob" }}
           output_map {{ key: "OUT" value: "OUT" }} output_map {{ key: "SUM" value: "SUM" }} }} ]
}}
'''


def _model(root: Path, name: str, config: str, source: str = "") -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    if source:
        (root / name / "1" / "model.py").write_text(textwrap.dedent(source))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("ensemble_streams")
    i32 = 'data_type: TYPE_INT32 dims: [ -1 ]'
    _model(root, "pre", _python("pre", f'{{ name: "X" {i32} }}', f'{{ name: "Y" {i32} }}'), PRE)
    _model(root, "gen", _python(
        "gen", f'{{ name: "PROMPT" {i32} }}',
        '{ name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }, '
        '{ name: "BLOB" data_type: TYPE_FP32 dims: [ -1 ] }',
        "model_transaction_policy { decoupled: true }"), GEN)
    _model(root, "post", _python(
        "post", f'{{ name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "PROMPT" {i32} }}, '
        '{ name: "BLOB" data_type: TYPE_FP32 dims: [ -1 ] }',
        '{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }'), POST)
    _model(root, "llm", _ensemble("llm"))
    _model(root, "llm_one", _ensemble("llm_one", "max_inflight_requests: 1"))
    with running_cluster(root) as running:
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
    return [json.loads(chunk[len(b"data: "):]) for chunk in body.split(b"\n\n") if chunk.startswith(b"data: ")]


def expected(model: str, values: list[int], blob: int = 1) -> list[dict]:
    return [{"model_name": model, "model_version": "1", "OUT": (v + 1) * 10 + 1000 * len(values), "IDX": i,
             "SUM": float(i * blob)} for i, v in enumerate(values)]


def segments() -> int:
    return len(glob.glob("/dev/shm/shoal_*"))


def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for a condition"
        time.sleep(0.005)


def test_iterations_stream_in_order_with_upstream_tensors(cluster):
    values = [1, 2, 3, 4, 5]
    status, body = post(cluster.url, "/v2/models/llm/generate_stream", {"IN": values})
    assert status == 200
    assert events(body) == expected("llm", values)


def test_large_intermediates_of_every_iteration_are_freed(cluster):
    post(cluster.url, "/v2/models/llm/generate_stream", {"IN": [1], "blob": 32_768})  # warm
    baseline = segments()
    values = list(range(8))
    status, body = post(cluster.url, "/v2/models/llm/generate_stream", {"IN": values, "blob": 32_768})  # 128 KiB
    assert status == 200
    assert events(body) == expected("llm", values, 32_768)
    wait_until(lambda: segments() == baseline)


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
    baseline = segments()
    status, body = post(cluster.url, "/v2/models/llm/generate_stream", {"IN": [1, 2, 3], "fail_at": 1, "blob": 32_768})
    assert status == 200
    assert events(body) == [expected("llm", [1, 2, 3], 32_768)[0], {"error": "in ensemble 'llm', failed at 1"}]
    wait_until(lambda: segments() == baseline)
    stats = httpclient.InferenceServerClient(cluster.url).get_inference_statistics("llm")
    assert stats["model_stats"][0]["inference_stats"]["fail"]["count"] >= 1


def test_max_inflight_requests_one_delivers_everything_in_order(cluster):
    values = list(range(40))
    status, body = post(cluster.url, "/v2/models/llm_one/generate_stream", {"IN": values, "blob": 20_000})
    assert status == 200
    assert events(body) == expected("llm_one", values, 20_000)


def test_client_disconnect_cancels_the_generator(cluster):
    post(cluster.url, "/v2/models/llm/generate_stream", {"IN": [1], "blob": 32_768})  # warm
    baseline = segments()
    host, port = cluster.url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v2/models/llm/generate_stream",
                 json.dumps({"IN": list(range(200)), "delay": 0.05, "id": "gone", "blob": 32_768}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.read(6) == b"data: "  # the stream has started
    conn.sock.close()
    conn.close()
    marker = cluster.root / "gen" / "1" / "cancelled-gone"
    wait_until(lambda: marker.exists(), timeout=10)
    wait_until(lambda: segments() == baseline)  # the iterations in flight were freed
    # and the ensemble is still serving
    status, body = post(cluster.url, "/v2/models/llm/generate_stream", {"IN": [3]})
    assert (status, events(body)) == (200, expected("llm", [3]))
