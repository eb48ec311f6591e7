"""Pure conversions between Triton's gRPC messages (`tritonclient.grpc.service_pb2`) and the
inference core's types and documents. No I/O: the servicer (`servicer.py`) does that.

Error texts follow Triton's gRPC front end (src/grpc/infer_handler.cc); a `ShoalError`'s
code becomes the gRPC status Triton uses for it (`STATUS`).
"""

from __future__ import annotations

import base64
from typing import Any

import grpc
import msgspec
import numpy as np
from google.protobuf import json_format

from inference.types import Answer, InputTensor, ParsedRequest, RequestedOutput
from services.gateway.tensor_limits import check_shape
from shared.config import triton_protos
from shared.config.datatypes import DATATYPES, numpy_dtype, serialize_bytes
from shared.errors import Code, ShoalError, invalid
from shared.wire.statistics import ModelStatistics

model_config_pb2: Any = triton_protos.load("model_config_pb2")
service_pb2: Any = triton_protos.load("service_pb2")

# TRITONSERVER_Error_Code -> grpc::StatusCode, as GrpcStatusUtil::CodeToStatus
STATUS = {
    Code.UNKNOWN: grpc.StatusCode.UNKNOWN,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Code.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Code.CANCELLED: grpc.StatusCode.CANCELLED,
    Code.FORBIDDEN: grpc.StatusCode.UNAVAILABLE,  # as Triton's restricted-protocol refusal
}

EMPTY_FINAL = "triton_enable_empty_final_response"
FINAL = "triton_final_response"
_RESERVED = (EMPTY_FINAL,)  # the only `triton_` request parameter a client may set


def status_code(error: ShoalError) -> grpc.StatusCode:
    try:
        return STATUS.get(Code(error.code), grpc.StatusCode.UNKNOWN)
    except ValueError:
        return grpc.StatusCode.UNKNOWN


# -- parameters ----------------------------------------------------------------------------


def value(param: service_pb2.InferParameter) -> Any:
    which = param.WhichOneof("parameter_choice")
    return None if which is None else getattr(param, which)


def set_value(param: service_pb2.InferParameter, item: Any) -> None:
    if isinstance(item, bool):
        param.bool_param = item
    elif isinstance(item, int):
        if item < 0 or item < 2**63:
            param.int64_param = item
        else:
            param.uint64_param = item
    elif isinstance(item, float):
        param.double_param = item
    else:
        param.string_param = str(item)


def _expect(name: str, param: service_pb2.InferParameter, kinds: tuple[str, ...], expected: str) -> Any:
    if param.WhichOneof("parameter_choice") not in kinds:
        raise invalid(f"invalid value type for '{name}' parameter, expected {expected}.")
    return value(param)


def request_parameters(params: Any) -> tuple[dict[str, Any], bool]:
    """A ModelInferRequest's parameters as the core reads them, and whether the client asked
    for an empty final response (`triton_enable_empty_final_response`)."""
    out: dict[str, Any] = {}
    empty_final = False
    if not params:  # nearly always; a protobuf map's items() is collections.abc's, in Python
        return out, empty_final
    for key, param in params.items():
        if key == "sequence_id":
            out[key] = _expect(key, param, ("int64_param", "string_param"), "int64_param or string_param")
        elif key in ("sequence_start", "sequence_end"):
            out[key] = _expect(key, param, ("bool_param",), "bool_param")
        elif key == "priority":
            out[key] = _expect(key, param, ("int64_param", "uint64_param"), "int64_param or uint64_param")
            if out[key] < 0:
                raise invalid("invalid value for 'priority', expected value >= 0.")
        elif key == "timeout":
            out[key] = _expect(key, param, ("int64_param",), "int64_param")
        elif key.startswith("triton_"):
            if key not in _RESERVED:
                raise invalid(
                    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
                    "keys starting with 'triton_' are allowed: " + " ".join(_RESERVED)
                )
            empty_final = _expect(key, param, ("bool_param",), "bool_param")
        else:
            kinds = ("int64_param", "bool_param", "string_param", "double_param")
            out[key] = _expect(key, param, kinds, "int64_param, bool_param, or string_param")
    return out, empty_final


def _tensor_parameters(params: Any) -> dict[str, Any]:
    """A tensor's parameters; the shared-memory ones type checked as Triton's ParseSharedMemoryParams."""
    if not params:  # nearly always: each look-up below is a protobuf map access
        return {}
    out = {key: value(param) for key, param in params.items()}
    checks = (
        ("shared_memory_region", "string_param"),
        ("shared_memory_offset", "int64_param"),
        ("shared_memory_byte_size", "int64_param"),
    )
    for key, kind in checks:
        if key in params and params[key].WhichOneof("parameter_choice") != kind:
            raise invalid(f"invalid value type for '{key}' parameter, expected {kind}.")
    return out


# -- inference requests --------------------------------------------------------------------

_TYPED = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def _contents_type(field: str, datatype: str) -> str:
    """The datatype Triton names for a typed-contents list (int/uint lists also carry 8/16 bits)."""
    if field == "int_contents":
        return datatype if datatype in ("INT8", "INT16") else "INT32"
    if field == "uint_contents":
        return datatype if datatype in ("UINT8", "UINT16") else "UINT32"
    return next(t for t, f in _TYPED.items() if f == field)


def typed_contents(name: str, model: str, datatype: str, contents: service_pb2.InferTensorContents) -> bytes:
    """`contents` (typed lists) -> wire bytes; the list must be the one of the input's datatype."""
    given = [field.name for field, _ in contents.ListFields()]
    expected = _TYPED.get(datatype)
    for field in given:
        if field != expected:
            raise invalid(
                f"unexpected explicit tensor data for input tensor '{name}' for model '{model}' of type "
                f"'{_contents_type(field, datatype)}', expected datatype '{datatype}'"
            )
    if expected is None or not given:
        return b""
    items = getattr(contents, expected)
    if datatype == "BYTES":
        array = np.empty(len(items), dtype=object)
        array[:] = list(items)
        return serialize_bytes(array)
    return np.asarray(items).astype(numpy_dtype(datatype)).tobytes()


def parse_infer(request: service_pb2.ModelInferRequest) -> tuple[ParsedRequest, bool]:
    """A ModelInferRequest -> the core's request (raw contents are not copied), and the
    empty-final-response flag."""
    model = request.model_name
    parameters, empty_final = request_parameters(request.parameters)
    raw = request.raw_input_contents
    inputs, index = [], 0
    for io in request.inputs[:]:  # upb: a slice is one list; iterating the field is a Python-level protocol
        params = _tensor_parameters(io.parameters)
        has_contents = io.HasField("contents")
        if io.datatype not in DATATYPES:
            raise invalid(f"invalid datatype '{io.datatype}' for input '{io.name}'")
        check_shape(io.name, io.shape)  # before any data is read, as over HTTP
        if "shared_memory_region" in params:
            if has_contents:
                raise invalid(
                    f"unexpected 'content' provided when using shared memory for input tensor '{io.name}' "
                    f"for model '{model}'"
                )
            data: bytes | None = None
        elif has_contents and len(raw):
            raise invalid(
                f"contents field must not be specified when using raw_input_contents for '{io.name}' "
                f"for model '{model}'"
            )
        elif has_contents:
            data = typed_contents(io.name, model, io.datatype, io.contents)
        elif index < len(raw):
            data = raw[index]
            index += 1
        else:
            raise invalid(f"unable to find data for input tensor '{io.name}' for model '{model}' in request.")
        inputs.append(InputTensor(io.name, io.datatype, io.shape[:], data, params))  # [:]: as above
    outputs = [_requested(out) for out in request.outputs[:]] or None
    return ParsedRequest(request.id, inputs, outputs, parameters), empty_final


def _requested(out: service_pb2.ModelInferRequest.InferRequestedOutputTensor) -> RequestedOutput:
    given = out.parameters
    params = _tensor_parameters(given)
    count = 0
    if "classification" in params:
        param = given["classification"]
        if param.WhichOneof("parameter_choice") != "int64_param":
            raise invalid("invalid value type for 'classification' parameter, expected int64_param")
        if param.int64_param <= 0:
            raise invalid("invalid value for 'classification' parameter, expected >= 1")
        count = param.int64_param
    return RequestedOutput(out.name, True, count, params)


# -- inference responses ------------------------------------------------------------------


def infer_response(answer: Answer, stream: bool = False) -> service_pb2.ModelInferResponse:
    """Every output as raw bytes (Triton's gRPC answers never use typed contents); one raw
    entry per output, empty for one written into the client's shared memory."""
    response = service_pb2.ModelInferResponse(model_name=answer.model, model_version=str(answer.version), id=answer.id)
    for out in answer.outputs:
        response.outputs.add(name=out.name, datatype=out.datatype, shape=out.shape)
        response.raw_output_contents.append(b"" if out.data is None else bytes(out.data))
    for key, item in answer.parameters.items():
        set_value(response.parameters[key], item)
    if stream:
        response.parameters[FINAL].bool_param = answer.final
    return response


def stream_error(error: ShoalError, request: service_pb2.ModelInferRequest) -> service_pb2.ModelStreamInferResponse:
    """A failed request on a stream: an error message; the stream itself goes on."""
    response = service_pb2.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    return service_pb2.ModelStreamInferResponse(error_message=error.message, infer_response=response)


# -- documents ----------------------------------------------------------------------------


def model_metadata(doc: dict[str, Any]) -> service_pb2.ModelMetadataResponse:
    return json_format.ParseDict(doc, service_pb2.ModelMetadataResponse())


def model_config(doc: dict[str, Any]) -> service_pb2.ModelConfigResponse:
    """The normalized JSON config back to Triton's ModelConfig protobuf."""
    config = json_format.ParseDict(doc, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
    return service_pb2.ModelConfigResponse(config=config)


def statistics(entries: list[ModelStatistics]) -> service_pb2.ModelStatisticsResponse:
    """Triton's JSON form of each entry, read into the protobuf (Shoal's `ensemble_steps` has no field there)."""
    return json_format.ParseDict(
        {"model_stats": msgspec.to_builtins(entries)}, service_pb2.ModelStatisticsResponse(), ignore_unknown_fields=True
    )


def repository_index(entries: list[dict[str, Any]]) -> service_pb2.RepositoryIndexResponse:
    return json_format.ParseDict({"models": entries}, service_pb2.RepositoryIndexResponse(), ignore_unknown_fields=True)


def load_parameters(params: Any) -> dict[str, Any]:
    """RepositoryModelLoad parameters as the core takes them: files' bytes base64 encoded."""
    out = {}
    for key, param in params.items():
        item = value(param)
        out[key] = base64.b64encode(item).decode() if isinstance(item, bytes) else item
    return out


def shm_status(kind: str, regions: list[dict[str, Any]]) -> Any:
    if kind == "system":
        system = service_pb2.SystemSharedMemoryStatusResponse()
        for region in regions:
            system.regions[region["name"]].CopyFrom(service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(**region))
        return system
    cuda = service_pb2.CudaSharedMemoryStatusResponse()
    for region in regions:
        cuda.regions[region["name"]].CopyFrom(service_pb2.CudaSharedMemoryStatusResponse.RegionStatus(**region))
    return cuda


def trace_update(settings: Any) -> dict[str, Any]:
    """TraceSettingRequest settings -> the trace extension's update (an empty value clears)."""
    update: dict[str, Any] = {}
    for key, setting in settings.items():
        values = list(setting.value)
        if not values:
            update[key] = None
        else:
            update[key] = values if key == "trace_level" else values[0]
    return update


def trace_response(doc: dict[str, Any]) -> service_pb2.TraceSettingResponse:
    response = service_pb2.TraceSettingResponse()
    for key, item in doc.items():
        response.settings[key].value.extend([str(v) for v in item] if isinstance(item, list) else [str(item)])
    return response


def log_update(settings: Any) -> dict[str, Any]:
    return {
        key: getattr(s, s.WhichOneof("parameter_choice"))
        for key, s in settings.items()
        if s.WhichOneof("parameter_choice")
    }


def log_response(doc: dict[str, Any]) -> service_pb2.LogSettingsResponse:
    response = service_pb2.LogSettingsResponse()
    for key, item in doc.items():
        setting = response.settings[key]
        if isinstance(item, bool):
            setting.bool_param = item
        elif isinstance(item, int):
            setting.uint32_param = item
        else:
            setting.string_param = str(item)
    return response
