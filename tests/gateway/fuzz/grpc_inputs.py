"""Hypothesis strategies for `ModelInfer` request messages: valid ones with fields changed
(datatypes, shapes, contents, raw contents, parameters) and their bytes broken (cut, flipped,
spliced), sent as raw bytes through a grpcio channel's generic unary call."""

from __future__ import annotations

from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from tests.gateway.fuzz.kserve_inputs import MODELS

INT64 = st.integers(-(2**63), 2**63 - 1)
int64_shapes = st.lists(st.sampled_from([1, 16, 0, -1, 2**31, 2**63 - 1, -(2**63)]) | INT64, max_size=5)
datatypes = st.sampled_from(["INT32", "FP32", "BYTES", "BOOL", "FP16", "BF16", "UINT64", "", "X"]) | st.text(max_size=5)


def valid_simple() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="simple", id="fuzz")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend(range(16))
    request.outputs.add(name="OUTPUT0")
    return request


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    request = valid_simple()
    request.model_name = draw(st.sampled_from(MODELS) | st.text(max_size=8))
    request.model_version = draw(st.sampled_from(["", "1", "2", "-1", "x"]))
    for tensor in request.inputs:
        if draw(st.booleans()):
            tensor.datatype = draw(datatypes)
        if draw(st.booleans()):
            del tensor.shape[:]
            tensor.shape.extend(draw(int64_shapes))
        which = draw(st.integers(0, 4))
        if which == 1:
            tensor.contents.Clear()
            tensor.contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=20)))
        elif which == 2:
            tensor.contents.Clear()
            tensor.contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=8), max_size=20)))
        elif which == 3:
            tensor.contents.Clear()
            request.raw_input_contents.append(draw(st.binary(max_size=80)))
        if draw(st.integers(0, 3)) == 0:
            tensor.parameters[
                draw(st.sampled_from(["shared_memory_region", "binary_data_size", "x"]))
            ].int64_param = draw(INT64)
    if draw(st.integers(0, 3)) == 0:
        key = draw(st.sampled_from(["priority", "timeout", "sequence_id", "sequence_start", "triton_x", "x"]))
        param = request.parameters[key]
        kind = draw(st.integers(0, 3))
        if kind == 0:
            param.int64_param = draw(INT64)
        elif kind == 1:
            param.uint64_param = draw(st.integers(0, 2**64 - 1))
        elif kind == 2:
            param.string_param = draw(st.text(max_size=8))
        else:
            param.double_param = draw(st.floats())
    return request


@st.composite
def infer_messages(draw: st.DrawFn) -> bytes:
    """A `ModelInferRequest`'s bytes, whole or broken."""
    raw = draw(infer_requests()).SerializeToString()
    how = draw(st.integers(0, 4))
    if how == 1:
        return raw[: draw(st.integers(0, len(raw)))]
    if how == 2 and raw:
        at = draw(st.integers(0, len(raw) - 1))
        return raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1 :]
    if how == 3:
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + draw(st.binary(min_size=1, max_size=16)) + raw[at:]
    if how == 4:
        return draw(st.binary(max_size=200))
    return raw
