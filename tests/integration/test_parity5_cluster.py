"""Triton parity V (issue 48): NVIDIA's own examples run unchanged, against one cluster through
tritonclient. Texts and sources: docs/compatibility.md, "Parity V"."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.cluster import running_cluster


def _io(kind: str, name: str, datatype: str, dims: str) -> str:
    return f'{kind} [ {{ name: "{name}" data_type: {datatype} dims: [ {dims} ] }} ]\n'


def _python_model(root: Path, name: str, source: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(source)
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n' + config)


# -- item 1: python_backend's examples/bls and examples/bls_decoupled, what they do that matters --
ADD_SUB = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return out
"""
ADD_SUB_IO = "".join(
    _io(k, n, "TYPE_FP32", "4")
    for k, n in (("input", "INPUT0"), ("input", "INPUT1"), ("output", "OUTPUT0"), ("output", "OUTPUT1"))
)

# examples/bls/sync_model.py: the target's name is the MODEL_NAME input's element, a bytes object
BLS_BY_NAME = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            bls = pb_utils.InferenceRequest(
                model_name=name, requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[pb_utils.get_input_tensor_by_name(request, n) for n in ("INPUT0", "INPUT1")])
            response = bls.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            out.append(pb_utils.InferenceResponse(output_tensors=response.output_tensors()))
        return out
"""

# examples/decoupled/square_model.py: IN responses of OUT = IN, then the final flag alone
SQUARE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0]
            sender = request.get_response_sender()
            for _ in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([n], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
SQUARE_CONFIG = (
    _io("input", "IN", "TYPE_INT32", "1")
    + _io("output", "OUT", "TYPE_INT32", "1")
    + "model_transaction_policy { decoupled: true }\ninstance_group [{ kind: KIND_CPU }]\n"
)

# examples/bls_decoupled/sync_model.py: a plain `for` over exec(decoupled=True), an int64 sum
BLS_DECOUPLED_SYNC = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        bls = pb_utils.InferenceRequest(model_name="square_int32", requested_output_names=["OUT"],
                                        inputs=[pb_utils.get_input_tensor_by_name(requests[0], "IN")])
        total = np.array([0])
        for response in bls.exec(decoupled=True):
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            if len(response.output_tensors()) > 0:
                total += pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])]
"""

# examples/bls_decoupled/async_model.py: two async_exec(decoupled=True) gathered, each a plain `for`
BLS_DECOUPLED_ASYNC = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        num = pb_utils.get_input_tensor_by_name(requests[0], "IN")
        waits = [pb_utils.InferenceRequest(model_name="square_int32", inputs=[num],
                                           requested_output_names=["OUT"]).async_exec(decoupled=True)
                 for _ in range(2)]
        total = np.array([0])
        for responses in await asyncio.gather(*waits):
            for response in responses:
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if len(response.output_tensors()) > 0:
                    total += pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])]
"""
BLS_DECOUPLED_CONFIG = (
    _io("input", "IN", "TYPE_INT32", "1")
    + _io("output", "SUM", "TYPE_INT32", "1")
    + "instance_group [{ kind: KIND_CPU }]\n"
)


def build_repository(root: Path) -> Path:
    _python_model(root, "add_sub", ADD_SUB, ADD_SUB_IO)
    _python_model(root, "bls_sync", BLS_BY_NAME, _io("input", "MODEL_NAME", "TYPE_STRING", "1") + ADD_SUB_IO)
    _python_model(root, "square_int32", SQUARE, SQUARE_CONFIG)
    _python_model(root, "bls_decoupled_sync", BLS_DECOUPLED_SYNC, BLS_DECOUPLED_CONFIG)
    _python_model(root, "bls_decoupled_async", BLS_DECOUPLED_ASYNC, BLS_DECOUPLED_CONFIG)
    return root


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = build_repository(tmp_path_factory.mktemp("parity5"))
    with running_cluster(root) as running:
        running.root = root
        yield running


def _client(served, protocol: str):
    if protocol == "http":
        return httpclient.InferenceServerClient(served.url, network_timeout=60)
    return grpcclient.InferenceServerClient(served.grpc_url)


def _inputs(module, arrays: dict[str, np.ndarray]) -> list:
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == np.object_ else {"float32": "FP32", "int32": "INT32"}[str(array.dtype)]
        tensor = module.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


# -- item 1 --------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_takes_the_targets_name_as_bytes(served, protocol):
    """examples/bls sync: MODEL_NAME's element (bytes) names the target, as python_backend takes it."""
    module = httpclient if protocol == "http" else grpcclient
    client = _client(served, protocol)
    a, b = np.random.rand(4).astype(np.float32), np.random.rand(4).astype(np.float32)
    name = np.array(["add_sub"], dtype=np.object_)
    result = client.infer("bls_sync", _inputs(module, {"MODEL_NAME": name, "INPUT0": a, "INPUT1": b}))
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    client.close()


@pytest.mark.parametrize("model, copies", [("bls_decoupled_sync", 1), ("bls_decoupled_async", 2)])
def test_decoupled_bls_examples_sum_their_streams(served, model, copies):
    """examples/bls_decoupled: exec(decoupled=True) and async_exec(decoupled=True) give iterators
    a plain `for` reads (the final flag alone arrives as an empty response); the model's INT64 sum
    goes out as INT64 though its config says INT32, as python_backend sends it."""
    client = _client(served, "http")
    for value in (4, 2, 0, 1):
        result = client.infer(model, _inputs(httpclient, {"IN": np.array([value], np.int32)}))
        output = result.as_numpy("SUM")
        assert output.dtype == np.int64 and output.tolist() == [copies * value * value]
    client.close()
