"""Triton's identity, repeat and square backends served by the real system, as Triton's QA and
perf_analyzer examples use them: identity through HTTP and gRPC with dynamic batching,
repeat and square as decoupled models over a gRPC stream, and perf_analyzer on both kinds."""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.cluster import Running, running_cluster
from tests.integration.test_perf_analyzer import run as perf_run

ROOT = Path(__file__).resolve().parents[2]

MODELS = {
    "identity_fp32": """
name: "identity_fp32"
backend: "identity"
max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
""",
    "identity_bad": """
name: "identity_bad"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] } ]
""",
    "repeat_int32": """
name: "repeat_int32"
backend: "repeat"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
        { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
""",
    "square_int32": """
name: "square_int32"
backend: "square"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
""",
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Running:
    root = tmp_path_factory.mktemp("test_backends")
    for name, config in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    with running_cluster(root) as running:
        yield running


def test_identity_over_http_and_grpc(served):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    http = httpclient.InferenceServerClient(served.url)
    inp = httpclient.InferInput("INPUT0", [2, 3], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(http.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), x)
    assert http.get_model_metadata("identity_fp32")["platform"] == "identity"
    grpc = grpcclient.InferenceServerClient(served.grpc_url)
    ginp = grpcclient.InferInput("INPUT0", [2, 3], "FP32")
    ginp.set_data_from_numpy(x)
    np.testing.assert_array_equal(grpc.infer("identity_fp32", [ginp]).as_numpy("OUTPUT0"), x)


def test_a_bad_identity_config_is_unavailable_with_the_backends_reason(served):
    http = httpclient.InferenceServerClient(served.url)
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index["identity_bad"]["state"] == "UNAVAILABLE"
    assert "expected input and output shape to match, got [2] and [3]" in index["identity_bad"]["reason"]


def stream_all(url: str, model: str, inputs: list, expected_final: int = 1) -> list:
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        got = []
        while True:
            result, error = results.get(timeout=30)
            got.append((result, error))
            if result is not None and result.get_response().parameters["triton_final_response"].bool_param:
                return got
    finally:
        client.stop_stream()
        client.close()


def grpc_input(name: str, value: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return tensor


def test_repeat_streams_in_over_grpc(served):
    inputs = [
        grpc_input("IN", np.array([5, 6, 7], np.int32), "INT32"),
        grpc_input("DELAY", np.array([10, 10, 10], np.uint32), "UINT32"),
        grpc_input("WAIT", np.array([0], np.uint32), "UINT32"),
    ]
    got = stream_all(served.grpc_url, "repeat_int32", inputs)
    assert all(error is None for _, error in got)
    values = [(int(r.as_numpy("OUT")[0]), int(r.as_numpy("IDX")[0])) for r, _ in got if r.as_numpy("OUT") is not None]
    assert values == [(5, 0), (6, 1), (7, 2)]


def test_square_streams_n_responses_over_grpc(served):
    got = stream_all(served.grpc_url, "square_int32", [grpc_input("IN", np.array([4], np.int32), "INT32")])
    assert [int(r.as_numpy("OUT")[0]) for r, _ in got if r is not None and r.as_numpy("OUT") is not None] == [4] * 4


def test_a_decoupled_model_over_http_is_refused_as_in_triton(served):
    http = httpclient.InferenceServerClient(served.url)
    inp = httpclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([2], np.int32))
    with pytest.raises(InferenceServerException):
        http.infer("square_int32", [inp])


def test_perf_analyzer_on_identity_and_on_a_decoupled_square(perf_analyzer, served, tmp_path):
    data = tmp_path / "square.json"
    data.write_text('{"data": [{"IN": [3]}]}')  # three responses a request (random data could ask millions)
    perf_run(perf_analyzer, served.url, "-m", "identity_fp32", "--shape", "INPUT0:16", "--concurrency-range", "4")
    perf_run(
        perf_analyzer,
        served.grpc_url,
        "-i",
        "grpc",
        "--streaming",
        "-m",
        "square_int32",
        "--input-data",
        str(data),
        "--concurrency-range",
        "2",
    )
