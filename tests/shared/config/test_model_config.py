from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


# -- Triton core's AutoCompleteBackendFields (src/model_config_utils.cc) as a table: the files in
# the first version directory ("dir/" a directory), the config's fields -> backend, platform, file
AUTOFILL_TABLE = [
    (["model.xml", "model.bin"], {}, ("openvino", "", "model.xml")),
    (["model.dali"], {}, ("dali", "", "model.dali")),
    (["model.onnx"], {}, ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
    (["model.onnx/"], {}, ("onnxruntime", "onnxruntime_onnx", "model.onnx")),  # a large ONNX model's folder
    (["model.plan"], {}, ("tensorrt", "tensorrt_plan", "model.plan")),
    (["model.plan/"], {"name": "m"}, None),  # a folder is no plan
    (["model.pt"], {}, ("pytorch", "pytorch_libtorch", "")),  # core sets the platform, so no file
    (["model.pt2"], {}, ("pytorch", "torch_aoti", "model.pt2")),
    (["model.py"], {}, ("python", "", "model.py")),
    (["model.savedmodel/"], {}, ("tensorflow", "tensorflow_savedmodel", "model.savedmodel")),
    (["model.graphdef"], {}, ("tensorflow", "tensorflow_graphdef", "model.graphdef")),
    # core's order: TensorRT before ONNX, ONNX before OpenVINO and python
    (["model.onnx", "model.plan", "model.py"], {}, ("tensorrt", "tensorrt_plan", "model.plan")),
    (["model.xml", "model.py"], {}, ("openvino", "", "model.xml")),
    # the config's fields first: platform, default file, backend
    ([], {"platform": "tensorrt_plan"}, ("tensorrt", "tensorrt_plan", "model.plan")),
    ([], {"platform": "libtorch"}, ("pytorch", "libtorch", "")),
    ([], {"platform": "torch_aoti"}, ("pytorch", "torch_aoti", "model.pt2")),
    ([], {"default_model_filename": "model.xml"}, ("openvino", "", "model.xml")),
    (["model.py"], {"default_model_filename": "model.onnx"}, ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
    (["model.py"], {"backend": "onnxruntime"}, ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
    ([], {"backend": "pytorch"}, ("pytorch", "pytorch_libtorch", "model.pt")),
    ([], {"backend": "identity"}, ("identity", "", "")),
    # core's rule for custom backends: the model's name `<anything>.<backend>`
    (["weights.bin"], {"name": "m.identity"}, ("identity", "", "model.identity")),
    (["weights.bin"], {"name": "m"}, None),
]


@pytest.mark.parametrize("files, fields, expected", AUTOFILL_TABLE)
def test_autofill_follows_cores_table(tmp_path, files, fields, expected):
    model_dir = tmp_path / fields.get("name", "m")
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "7").mkdir()  # "1" < "7": core looks in the first name only
    (model_dir / "7" / "model.py").write_text("")
    for name in files:
        path = model_dir / "1" / name.rstrip("/")
        path.mkdir() if name.endswith("/") else path.write_text("")
    config = mc.pb.ModelConfig(**fields)
    if expected is None:
        with pytest.raises(ShoalError, match="Could not determine backend for model 'm'"):
            mc.autofill_backend(config, model_dir, [7, 1])
        return
    mc.autofill_backend(config, model_dir, [7, 1])
    assert (config.backend, config.platform, config.default_model_filename) == expected


@given(
    backend=st.sampled_from(["", "onnxruntime", "python", "openvino", "dali", "identity"]),
    platform=st.sampled_from(["", "onnxruntime_onnx", "tensorrt_plan", "pytorch_libtorch"]),
    filename=st.sampled_from(["", "model.onnx", "model.xml", "custom.bin"]),
    files=st.sets(st.sampled_from(["model.onnx", "model.xml", "model.dali", "model.py", "model.pt"])),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_autofill_only_fills_what_the_config_leaves_empty(tmp_path_factory, backend, platform, filename, files):
    model_dir = tmp_path_factory.mktemp("auto") / "m"
    (model_dir / "1").mkdir(parents=True)
    for name in files:
        (model_dir / "1" / name).write_text("")
    config = mc.pb.ModelConfig(backend=backend, platform=platform, default_model_filename=filename)
    try:
        mc.autofill_backend(config, model_dir, [1])
    except ShoalError:  # nothing anywhere says which backend
        assert not (backend or platform or filename or files)
        return
    assert config.name == "m"
    for field, given_value in (("backend", backend), ("platform", platform), ("default_model_filename", filename)):
        assert getattr(config, field) == given_value or not given_value
