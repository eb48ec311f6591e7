"""The generate extension's request and response conversions (pure logic)."""

import json

import numpy as np
import pytest

from inference.types import OutputTensor
from services.gateway.http.generate import parse_generate, render_generate
from shared.config.model_config import spec_from_json
from shared.errors import ShoalError


def spec(dims: list[int], max_batch_size: int = 0, datatype: str = "TYPE_INT32"):
    return spec_from_json(
        {
            "name": "m",
            "max_batch_size": max_batch_size,
            "backend": "python",
            "input": [{"name": "IN", "data_type": datatype, "dims": dims}],
            "output": [{"name": "OUT", "data_type": datatype, "dims": dims}],
        }
    )


def test_keys_become_inputs_or_parameters():
    parsed = parse_generate(
        spec([-1]), {"id": "7", "IN": [1, 2, 3], "temperature": 0.5, "parameters": {"stream": True}}
    )
    assert parsed.id == "7" and parsed.parameters == {"temperature": 0.5, "stream": True}
    (tensor,) = parsed.inputs
    assert (tensor.name, tensor.shape) == ("IN", [3])
    assert np.frombuffer(tensor.data, np.int32).tolist() == [1, 2, 3]


def test_shape_from_config_dims():
    assert parse_generate(spec([2, -1]), {"IN": list(range(6))}).inputs[0].shape == [2, 3]
    assert parse_generate(spec([-1, -1]), {"IN": list(range(6))}).inputs[0].shape == [1, 6]
    assert parse_generate(spec([-1], max_batch_size=4), {"IN": 5}).inputs[0].shape == [1, 1]
    text = parse_generate(spec([1], datatype="TYPE_STRING"), {"IN": "hello"}).inputs[0]
    assert (text.datatype, text.shape, bytes(text.data)) == ("BYTES", [1], b"\x05\x00\x00\x00hello")


def test_bad_requests():
    with pytest.raises(ShoalError, match="both as a top-level key"):
        parse_generate(spec([-1]), {"x": 1, "parameters": {"x": 2}})
    with pytest.raises(ShoalError, match="must be a string, number or boolean"):
        parse_generate(spec([-1]), {"x": {"nested": 1}})
    with pytest.raises(ShoalError, match="scalar or a 1-D array"):
        parse_generate(spec([-1]), {"IN": [[1], [2]]})
    with pytest.raises(ShoalError):
        parse_generate(spec([-1]), ["not", "an", "object"])


def test_render_flattens_outputs():
    out = [
        OutputTensor("A", "INT32", [1], np.array([3], np.int32).tobytes(), False),
        OutputTensor("B", "FP32", [2], np.array([1.5, 2.5], np.float32).tobytes(), False),
    ]
    assert json.loads(render_generate("m", 1, "", out, {"p": "x"})) == {
        "model_name": "m",
        "model_version": "1",
        "p": "x",
        "A": 3,
        "B": [1.5, 2.5],
    }
