from __future__ import annotations

import pytest

from shared.config import model_config as mc
from shared.errors import ShoalError

CONFIG = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
output [ { name: "Y" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [] } } ]
dynamic_batching { max_queue_delay_microseconds: 100 preserve_ordering: true }
"""


def test_parse_error_names_file_line_and_column():
    with pytest.raises(ShoalError) as err:
        mc.parse_text('name: "m"\n  max_batch_sze: 2\n', "/r/m/config.pbtxt")
    assert "/r/m/config.pbtxt" in err.value.message and "2:3" in err.value.message
    assert "max_batch_sze" in err.value.message


def test_normalize_fills_triton_defaults():
    config = mc.parse_text(CONFIG)
    mc.autofill_backend(config, __import__("pathlib").Path("/r/m"), [1])
    mc.normalize(config)
    doc = mc.to_json(config)
    assert doc["backend"] == "onnxruntime" and doc["default_model_filename"] == "model.onnx"
    assert doc["dynamic_batching"]["preferred_batch_size"] == [8]
    assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert doc["input"][0]["dims"] == [-1, 4]
    assert doc["instance_group"] == [
        {
            "name": "m",
            "kind": "KIND_CPU",
            "count": 2,
            "gpus": [],
            "secondary_devices": [],
            "profile": [],
            "passive": False,
            "host_policy": "",
        }
    ]
    assert doc["version_policy"] == {"latest": {"num_versions": 1}}


def test_spec_from_json():
    config = mc.parse_text(CONFIG)
    mc.normalize(config)
    spec = mc.spec_from_json(mc.to_json(config))
    assert spec.max_batch_size == 8 and spec.instance_count == 1
    assert spec.inputs[0].datatype == "FP32" and spec.inputs[0].variable
    assert spec.outputs[0].datatype == "BYTES" and spec.outputs[0].reshape == ()
    assert spec.dynamic_batching.preserve_ordering and spec.dynamic_batching.max_queue_delay_us == 100


@pytest.mark.parametrize(
    "text, message",
    [
        ('name: "m" max_batch_size: -1', "must be non-negative"),
        ('name: "m" max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 8 ] }', "preferred size"),
        ('name: "m" input [ { name: "X" dims: [ 1 ] } ]', "must specify 'data_type'"),
        ('name: "m" input [ { name: "X" data_type: TYPE_FP32 dims: [ 0 ] } ]', "must be > 0 or -1"),
        ('name: "m" instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]', "specifies one or more GPUs"),
    ],
)
def test_validation_errors(text, message):
    with pytest.raises(ShoalError) as err:
        mc.validate(mc.parse_text(text))
    assert message in err.value.message


def test_json_override_parse():
    config = mc.parse_json('{"max_batch_size": 2, "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [3]}]}')
    assert config.max_batch_size == 2 and list(config.input[0].dims) == [3]
    with pytest.raises(ShoalError) as err:
        mc.parse_json('{"inputs": []}')
    assert err.value.message.startswith("Invalid config override")


def test_instance_group_default_names_follow_triton():
    listed = mc.parse_text('name: "m"\nbackend: "onnxruntime"\ninstance_group [ { count: 1 } ]\n')
    mc.normalize(listed)
    assert [g.name for g in listed.instance_group] == ["m_0"]  # listed without a name
    created = mc.parse_text('name: "m"\nbackend: "onnxruntime"\n')
    mc.normalize(created)
    assert [g.name for g in created.instance_group] == ["m"]  # created by normalization


def test_a_config_that_is_not_utf8_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "config.pbtxt"
    path.write_bytes(b'name: "m"\nbackend: "onnx\xffruntime"\n')
    with pytest.raises(ShoalError, match=r"failed to read text proto from .*config.pbtxt: 2: invalid UTF-8 data"):
        mc.read_text(path)
    path.write_bytes('name: "m\u00e9"\n'.encode())
    assert mc.read_text(path) == 'name: "m\u00e9"\n'
