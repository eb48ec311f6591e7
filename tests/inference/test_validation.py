from __future__ import annotations

import numpy as np
import pytest

from inference.types import InputTensor, ParsedRequest, RequestedOutput
from inference.validation import validate
from shared.config.model_config import DynamicBatching, ModelSpec, TensorSpec
from shared.errors import ShoalError


def spec(max_batch_size: int = 8, dims=(-1,), optional=False) -> ModelSpec:
    return ModelSpec(
        name="m",
        platform="onnxruntime_onnx",
        backend="onnxruntime",
        max_batch_size=max_batch_size,
        inputs=(TensorSpec("X", "FP32", tuple(dims)), TensorSpec("Y", "INT32", (2,), optional=optional)),
        outputs=(TensorSpec("O", "FP32", tuple(dims)),),
        dynamic_batching=DynamicBatching((max_batch_size,), 0, False),
        instance_count=1,
        instance_kind="KIND_CPU",
        decoupled=False,
        default_model_filename="model.onnx",
    )


def tensor(name: str, datatype: str, shape: list[int]) -> InputTensor:
    nbytes = int(np.prod(shape)) * 4
    return InputTensor(name, datatype, shape, bytes(nbytes))


def test_batch_size_and_shape_signature():
    request = ParsedRequest(
        "", [tensor("X", "FP32", [3, 5]), tensor("Y", "INT32", [3, 2])], None, {"binary_data_output": True}
    )
    valid = validate(spec(), request)
    assert valid.batch_size == 3 and valid.shape_sig == "X[5]"
    assert valid.binary == {"O": True} and valid.outputs == []


def test_optional_inputs_split_batches():
    request = ParsedRequest("", [tensor("X", "FP32", [1, 5])], None, {})
    assert validate(spec(optional=True), request).shape_sig == "X[5];|X"


def test_requested_outputs_binary_flag():
    request = ParsedRequest(
        "",
        [tensor("X", "FP32", [1, 1]), tensor("Y", "INT32", [1, 2])],
        [RequestedOutput("O")],
        {"binary_data_output": True},
    )
    assert validate(spec(), request).binary == {"O": False}  # listed without binary_data: JSON


@pytest.mark.parametrize(
    "inputs, message",
    [
        ([tensor("X", "FP32", [9, 1]), tensor("Y", "INT32", [9, 2])], "batch-size must be <= 8"),
        ([tensor("X", "FP32", [2, 1]), tensor("Y", "INT32", [1, 2])], "batch size does not match"),
        (
            [tensor("X", "INT32", [1, 1]), tensor("Y", "INT32", [1, 2])],
            "data-type is 'INT32', but model 'm' expects 'FP32'",
        ),
        ([tensor("X", "FP32", [1, 1]), tensor("Y", "INT32", [1, 3])], "Expected [-1,2], got [1,3]"),
        ([tensor("X", "FP32", [1, 1])], "missing required input(s) ['Y']"),
        (
            [tensor("X", "FP32", [1, 1]), tensor("Y", "INT32", [1, 2]), tensor("Z", "FP32", [1])],
            "unexpected inference input 'Z'",
        ),
    ],
)
def test_errors(inputs, message):
    with pytest.raises(ShoalError) as err:
        validate(spec(), ParsedRequest("", inputs, None, {}))
    assert message in err.value.message and err.value.message.startswith("[request id: <id_unknown>] ")
