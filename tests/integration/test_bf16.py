"""BF16 across the protocol and the ONNX Runtime backend, as Triton's L0_backend_onnxruntime BF16
test drives it: `ml_dtypes.bfloat16` arrays through the official clients, binary over HTTP and raw
contents over gRPC, an add/sub model batched along its first dimension; JSON refused both ways with
Triton's texts. ONNX Runtime's CPU provider has no BF16 Add/Sub kernels (Triton's QA keeps its BF16
ONNX models off the CPU): the model here computes in FP32 between Casts, Triton's exact model fails
its load on the CPU in Shoal as in Triton."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from services.repository.examples import write_model
from tests.cluster import Running, running_cluster

BF16, FP32 = TensorProto.BFLOAT16, TensorProto.FLOAT
CONFIG = """
name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_BF16 dims: [ 16 ] }}, {{ name: "INPUT1" data_type: TYPE_BF16 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_BF16 dims: [ 16 ] }}, {{ name: "OUTPUT1" data_type: TYPE_BF16 dims: [ 16 ] }} ]
"""


def add_sub_graph(name: str, through_fp32: bool):
    """Triton's gen_qa_models add/sub graph in BF16; `through_fp32`: Add/Sub run on FP32 Casts."""
    io = [helper.make_tensor_value_info(n, BF16, ["batch", 16]) for n in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")]
    if through_fp32:
        nodes = [helper.make_node("Cast", [f"INPUT{i}"], [f"_INPUT{i}"], to=FP32) for i in (0, 1)]
    else:
        nodes = [helper.make_node("Identity", [f"INPUT{i}"], [f"_INPUT{i}"]) for i in (0, 1)]
    nodes += [
        helper.make_node("Add", ["_INPUT0", "_INPUT1"], ["CAST0"]),
        helper.make_node("Sub", ["_INPUT0", "_INPUT1"], ["CAST1"]),
        helper.make_node("Cast", ["CAST0"], ["OUTPUT0"], to=BF16),
        helper.make_node("Cast", ["CAST1"], ["OUTPUT1"], to=BF16),
    ]
    return helper.make_graph(nodes, name, io[:2], io[2:])


@pytest.fixture(scope="module")
def bf16_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root: Path = tmp_path_factory.mktemp("bf16_models")
    write_model(root, "onnx_bf16_cast", add_sub_graph("onnx_bf16_cast", True), CONFIG.format(name="onnx_bf16_cast"))
    write_model(
        root,
        "onnx_bf16_bf16_bf16",
        add_sub_graph("onnx_bf16_bf16_bf16", False),
        CONFIG.format(name="onnx_bf16_bf16_bf16"),
    )
    with running_cluster(root) as running:
        yield running


def _cases() -> tuple[np.ndarray, np.ndarray]:
    """Triton's test_bf16_add_sub_variants: one row per case, batched in one request."""
    cases = [(0.0, 0.0), (-1.5, 3.5), (100.0, 200.0), (1e-2, 1e-2), (1.0, -1.0), (2.0, 2.0), (3.14159, 2.71828)]
    a = np.empty((len(cases), 16), dtype=ml_dtypes.bfloat16)
    b = np.empty_like(a)
    for row, (x, y) in enumerate(cases):
        a[row, :], b[row, :] = x, y
    return a, b


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_bf16_add_sub_through_the_official_clients(bf16_cluster, module):
    url = bf16_cluster.url if module is httpclient else bf16_cluster.grpc_url
    client = module.InferenceServerClient(url)
    a, b = _cases()
    inputs = [module.InferInput(f"INPUT{i}", list(a.shape), "BF16") for i in (0, 1)]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("onnx_bf16_cast", inputs)
    plus, minus = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    assert plus.dtype == minus.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(plus, a + b)
    np.testing.assert_array_equal(minus, a - b)
    outputs = result.get_response(as_json=True)["outputs"] if module is grpcclient else result.get_response()["outputs"]
    assert {o["datatype"] for o in outputs} == {"BF16"}


def test_bf16_add_sub_in_bf16_has_no_cpu_kernel_in_onnxruntime(bf16_cluster):
    client = httpclient.InferenceServerClient(bf16_cluster.url)
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["onnx_bf16_bf16_bf16"]["state"] == "UNAVAILABLE"
    assert "Could not find an implementation for Add" in index["onnx_bf16_bf16_bf16"]["reason"]


def _post(running: Running, body: dict) -> requests.Response:
    return requests.post(f"http://{running.url}/v2/models/onnx_bf16_cast/infer", data=json.dumps(body), timeout=30)


def test_bf16_as_json_is_refused_both_ways_with_tritons_texts(bf16_cluster):
    ones = [1.0] * 16
    as_json = {"inputs": [{"name": f"INPUT{i}", "shape": [1, 16], "datatype": "BF16", "data": ones} for i in (0, 1)]}
    response = _post(bf16_cluster, as_json)
    assert response.status_code == 400
    assert response.json()["error"] == (
        "receiving BF16 data via JSON is not supported. Please use the binary data format for input INPUT0"
    )
    raw = np.ones((1, 16), dtype=ml_dtypes.bfloat16).tobytes()
    inputs = [
        {"name": f"INPUT{i}", "shape": [1, 16], "datatype": "BF16", "parameters": {"binary_data_size": 32}}
        for i in (0, 1)
    ]
    header = json.dumps(
        {"inputs": inputs, "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]}
    ).encode()
    response = requests.post(
        f"http://{bf16_cluster.url}/v2/models/onnx_bf16_cast/infer",
        data=header + raw + raw,
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=30,
    )
    assert response.status_code == 400
    assert response.json()["error"] == (
        "sending BF16 data via JSON is not supported. Please use the binary data format for output"
    )
