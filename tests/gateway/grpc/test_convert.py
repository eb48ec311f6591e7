"""gRPC messages <-> the inference core's types: pure conversions, Triton's texts."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from inference.types import Answer, OutputTensor
from services.gateway.grpc import convert
from services.gateway.grpc.startup import restrictions
from shared.config.datatypes import deserialize_bytes
from shared.errors import Code, ShoalError


def request(**inputs) -> pb.ModelInferRequest:
    r = pb.ModelInferRequest(model_name="m", id="7")
    for name, array in inputs.items():
        r.inputs.add(name=name, datatype="INT32", shape=list(array.shape))
        r.raw_input_contents.append(array.tobytes())
    return r


def test_raw_inputs_keep_their_bytes_and_order():
    a, b = np.arange(4, dtype=np.int32), np.arange(4, 8, dtype=np.int32)
    parsed, empty_final = convert.parse_infer(request(A=a, B=b))
    assert parsed.id == "7" and not empty_final and parsed.outputs is None
    assert [t.name for t in parsed.inputs] == ["A", "B"]
    assert bytes(parsed.inputs[1].data) == b.tobytes() and parsed.inputs[1].shape == [4]


@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=20))
def test_typed_int32_contents_equal_raw_bytes(values):
    r = pb.ModelInferRequest(model_name="m")
    r.inputs.add(name="X", datatype="INT32", shape=[len(values)]).contents.int_contents.extend(values)
    parsed, _ = convert.parse_infer(r)
    assert parsed.inputs[0].data == np.array(values, np.int32).tobytes()


def test_typed_bytes_and_int8_contents():
    r = pb.ModelInferRequest(model_name="m")
    r.inputs.add(name="S", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"ab", b""])
    r.inputs.add(name="I", datatype="INT8", shape=[2]).contents.int_contents.extend([-1, 5])
    parsed, _ = convert.parse_infer(r)
    assert list(deserialize_bytes(parsed.inputs[0].data)) == [b"ab", b""]
    assert parsed.inputs[1].data == np.array([-1, 5], np.int8).tobytes()


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda r: r.inputs.add(name="X", datatype="FP32", shape=[1]).contents.int_contents.append(1),
            "unexpected explicit tensor data for input tensor 'X' for model 'm' of type 'INT32', "
            "expected datatype 'FP32'",
        ),
        (
            lambda r: r.inputs.add(name="X", datatype="INT32", shape=[1]),
            "unable to find data for input tensor 'X' for model 'm' in request.",
        ),
        (
            lambda r: (
                r.inputs.add(name="X", datatype="INT32", shape=[1]).contents.int_contents.append(1),
                r.raw_input_contents.append(b"1234"),
            ),
            "contents field must not be specified when using raw_input_contents for 'X' for model 'm'",
        ),
        (
            lambda r: r.parameters["sequence_start"].CopyFrom(pb.InferParameter(int64_param=1)),
            "invalid value type for 'sequence_start' parameter, expected bool_param.",
        ),
        (
            lambda r: r.parameters["priority"].CopyFrom(pb.InferParameter(int64_param=-1)),
            "invalid value for 'priority', expected value >= 0.",
        ),
        (
            lambda r: r.parameters["triton_x"].CopyFrom(pb.InferParameter(bool_param=True)),
            "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
            "starting with 'triton_' are allowed: triton_enable_empty_final_response",
        ),
        (
            lambda r: r.parameters["custom"].CopyFrom(pb.InferParameter(uint64_param=2**63)),
            "invalid value type for 'custom' parameter, expected int64_param, bool_param, or string_param.",
        ),
        (
            lambda r: r.outputs.add(name="Y").parameters["classification"].CopyFrom(pb.InferParameter(int64_param=0)),
            "invalid value for 'classification' parameter, expected >= 1",
        ),
    ],
)
def test_request_errors_are_tritons(build, message):
    r = pb.ModelInferRequest(model_name="m")
    build(r)
    with pytest.raises(ShoalError) as err:
        convert.parse_infer(r)
    assert err.value.message == message and err.value.code == Code.INVALID_ARG


@pytest.mark.parametrize("shape", [[2**62, 4], [2**40, 2**40]])
def test_a_shape_overflowing_int64_is_refused_before_its_data_is_read(shape):
    """As over HTTP (tests/integration/test_protocol_corners.py): Triton's text, while parsing."""
    r = pb.ModelInferRequest(model_name="m")
    r.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
    r.raw_input_contents.append(b"")
    with pytest.raises(ShoalError) as err:
        convert.parse_infer(r)
    assert err.value.message == (
        f"invalid shape for input 'INPUT0': shape [{shape[0]},{shape[1]}] causes total element count "
        "to exceed maximum size of 9223372036854775807"
    )


def test_parameters_and_empty_final_flag():
    r = pb.ModelInferRequest(model_name="m")
    r.parameters["sequence_id"].string_param = "abc"
    r.parameters["sequence_start"].bool_param = True
    r.parameters["triton_enable_empty_final_response"].bool_param = True
    r.parameters["custom"].int64_param = 3
    parsed, empty_final = convert.parse_infer(r)
    assert empty_final and parsed.parameters == {"sequence_id": "abc", "sequence_start": True, "custom": 3}


def test_shared_memory_input_and_classified_output():
    r = pb.ModelInferRequest(model_name="m")
    tensor = r.inputs.add(name="X", datatype="FP32", shape=[4])
    tensor.parameters["shared_memory_region"].string_param = "region"
    tensor.parameters["shared_memory_byte_size"].int64_param = 16
    r.outputs.add(name="Y").parameters["classification"].int64_param = 2
    parsed, _ = convert.parse_infer(r)
    assert parsed.inputs[0].in_shared_memory
    assert parsed.inputs[0].parameters == {"shared_memory_region": "region", "shared_memory_byte_size": 16}
    assert parsed.outputs[0].classification == 2


def test_response_is_raw_with_the_final_flag_on_streams():
    data = np.arange(3, dtype=np.float32)
    answer = Answer("m", 2, "id", [OutputTensor("Y", "FP32", [3], memoryview(data.tobytes()), True)], {"k": "v"})
    response = convert.infer_response(answer, stream=True)
    assert response.model_version == "2" and response.id == "id"
    assert response.outputs[0].shape == [3] and response.raw_output_contents[0] == data.tobytes()
    assert response.parameters["k"].string_param == "v"
    assert response.parameters["triton_final_response"].bool_param is True
    assert "triton_final_response" not in convert.infer_response(answer).parameters


@pytest.mark.parametrize(
    "code, status",
    [
        (Code.INVALID_ARG, grpc.StatusCode.INVALID_ARGUMENT),
        (Code.NOT_FOUND, grpc.StatusCode.NOT_FOUND),
        (Code.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
        (Code.UNSUPPORTED, grpc.StatusCode.UNIMPLEMENTED),
        (Code.ALREADY_EXISTS, grpc.StatusCode.ALREADY_EXISTS),
        (Code.INTERNAL, grpc.StatusCode.INTERNAL),
        (Code.UNKNOWN, grpc.StatusCode.UNKNOWN),
    ],
)
def test_status_codes_are_tritons(code, status):
    assert convert.status_code(ShoalError("x", code)) == status


def test_documents_convert():
    config = {"name": "m", "max_batch_size": 8, "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": ["4"]}]}
    message = convert.model_config(config).config
    assert message.name == "m" and message.max_batch_size == 8 and list(message.input[0].dims) == [4]
    trace = convert.trace_response({"trace_level": ["TIMESTAMPS"], "trace_rate": "1000"})
    assert list(trace.settings["trace_level"].value) == ["TIMESTAMPS"] and trace.settings["trace_rate"].value == [
        "1000"
    ]
    update = pb.TraceSettingRequest()
    update.settings["trace_rate"].value.append("5")
    update.settings["trace_count"].SetInParent()
    assert convert.trace_update(update.settings) == {"trace_rate": "5", "trace_count": None}
    logs = convert.log_response({"log_info": True, "log_verbose_level": 1, "log_format": "default"})
    assert logs.settings["log_verbose_level"].uint32_param == 1 and logs.settings["log_info"].bool_param
    load = pb.RepositoryModelLoadRequest()
    load.parameters["file:1/model.onnx"].bytes_param = b"\x00\x01"
    load.parameters["config"].string_param = "{}"
    assert convert.load_parameters(load.parameters) == {"file:1/model.onnx": "AAE=", "config": "{}"}


def test_restricted_protocol_flags():
    assert restrictions(["inference,health:key=secret"]) == {
        "inference": ("key", "secret"),
        "health": ("key", "secret"),
    }
    for bad in (["inference"], ["nope:k=v"], ["health:a=b", "health:c=d"]):
        with pytest.raises(ValueError):
            restrictions(bad)
