from __future__ import annotations

import json

import numpy as np
import pytest

from shoal.perf.inputs import ModelInfo, TensorSpec, build_steps
from shoal.perf.options import PerfError, parse_range, parse_shape
from shoal.perf.over_http import encode_step


def test_ranges_are_perf_analyzers_start_end_step():
    assert parse_range("4") == [4]
    assert parse_range("1:4") == [1, 2, 3, 4]
    assert parse_range("2:8:3") == [2, 5, 8]
    assert parse_range("10:30:10", float) == [10.0, 20.0, 30.0]
    for bad in ("0:2", "3:1", "1:x", "1:2:0", "", "1::2"):
        with pytest.raises(PerfError):
            parse_range(bad)


def test_shapes():
    assert parse_shape("INPUT0:3,224,224") == ("INPUT0", [3, 224, 224])
    assert parse_shape("a:b:4") == ("a:b", [4])
    for bad in ("INPUT0", "INPUT0:", ":3", "INPUT0:x", "INPUT0:-2"):
        with pytest.raises(PerfError):
            parse_shape(bad)


MLP = ModelInfo("mlp", "", 64, [TensorSpec("INPUT0", "FP32", [-1, 256])], [TensorSpec("OUTPUT0", "FP32", [-1, 16])])


def test_random_and_zero_data_batch_the_sample():
    (step,) = build_steps(MLP, {}, "zero", 4)
    (tensor,) = step.inputs
    assert tensor.shape == [4, 256] and tensor.data == bytes(4 * 256 * 4)
    (random_step,) = build_steps(MLP, {}, "random", 1)
    assert len(random_step.inputs[0].data) == 256 * 4 and random_step.inputs[0].data != bytes(1024)
    assert step.outputs == ["OUTPUT0"]


def test_variable_dims_need_a_shape():
    model = ModelInfo("m", "", 8, [TensorSpec("IN", "INT32", [-1, -1])], [])
    with pytest.raises(PerfError, match="--shape IN"):
        build_steps(model, {}, "random", 1)
    (step,) = build_steps(model, {"IN": [5]}, "random", 2)
    assert step.inputs[0].shape == [2, 5]
    with pytest.raises(PerfError, match="above the model's max_batch_size"):
        build_steps(model, {"IN": [5]}, "random", 9)


def test_json_input_data_gives_one_step_per_entry(tmp_path):
    model = ModelInfo("m", "", 0, [TensorSpec("IN", "INT32", [2]), TensorSpec("S", "BYTES", [1])], [])
    data = {"data": [{"IN": [1, 2], "S": ["a"]}, {"IN": {"content": [3, 4], "shape": [2]}, "S": ["bb"]}]}
    path = tmp_path / "data.json"
    path.write_text(json.dumps(data))
    steps = build_steps(model, {}, str(path), 1)
    assert [np.frombuffer(s.inputs[0].data, np.int32).tolist() for s in steps] == [[1, 2], [3, 4]]
    assert steps[1].inputs[1].data == b"\x02\x00\x00\x00bb"  # BYTES: 4-byte length prefix
    path.write_text(json.dumps({"data": [{"IN": [1, 2, 3], "S": ["a"]}]}))
    with pytest.raises(PerfError, match="3 elements"):
        build_steps(model, {}, str(path), 1)


def test_http_body_uses_the_binary_extension():
    (step,) = build_steps(MLP, {}, "zero", 1)
    body, headers = encode_step(step)
    header_len = int(headers["Inference-Header-Content-Length"])
    header = json.loads(body[:header_len])
    assert header["inputs"][0]["parameters"] == {"binary_data_size": 1024}
    assert header["outputs"] == [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
    assert len(body) == header_len + 1024
