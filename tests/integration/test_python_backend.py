"""Triton python-backend models run unchanged: `model.py` with TritonPythonModel."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.cluster import running_cluster

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 1000 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "scale" value: {{ string_value: "2" }} }}
"""

ADD_SUB = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        self.scale = float(self.config["parameters"]["scale"]["string_value"])
        out = pb_utils.get_output_config_by_name(self.config, "OUTPUT0")
        self.dtype = pb_utils.triton_string_to_numpy(out["data_type"])
        assert args["model_name"] == "add_sub" and args["model_version"] == "1"

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if json.loads(request.parameters()).get("fail"):
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("asked to fail", pb_utils.TritonError.INVALID_ARG)))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", ((a + b) * self.scale).astype(self.dtype)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtype)),
            ]))
        return responses
"""

ASYNC_RAISING = """
import asyncio
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.sleep(0)
        a = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        if a.sum() < 0:
            raise ValueError("negative input")
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()),
            pb_utils.Tensor("OUTPUT1", pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()),
        ]) for r in requests]
"""


@pytest.fixture(scope="module")
def python_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("python_models")
    for name, source in (("add_sub", ADD_SUB), ("async_raising", ASYNC_RAISING)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(textwrap.dedent(source))
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    with running_cluster(root) as running:
        yield running


def inputs(a: np.ndarray, b: np.ndarray) -> list[httpclient.InferInput]:
    tensors = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        tensor = httpclient.InferInput(name, list(value.shape), "FP32")
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    return tensors


def test_python_model_runs_unchanged(python_models):
    client = httpclient.InferenceServerClient(python_models.url)
    assert client.get_model_metadata("add_sub")["platform"] == "python"
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), np.float32)
    result = client.infer("add_sub", inputs(a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), (a + b) * 2)  # `parameters` reached the model
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    client.close()


def test_model_errors_map_to_http_status(python_models):
    client = httpclient.InferenceServerClient(python_models.url)
    a = np.ones((1, 4), np.float32)
    with pytest.raises(InferenceServerException) as err:
        client.infer("add_sub", inputs(a, a), parameters={"fail": True})
    assert err.value.status() == "400" and err.value.message() == "asked to fail"
    with pytest.raises(InferenceServerException) as err:
        client.infer("async_raising", inputs(-a, a))
    assert err.value.status() == "500" and "ValueError: negative input" in err.value.message()
    result = client.infer("async_raising", inputs(a, 2 * a))  # the worker goes on serving
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), 2 * a)
    client.close()
