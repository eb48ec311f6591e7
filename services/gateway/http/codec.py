"""KServe v2 / Triton HTTP inference bodies: JSON, binary tensor extension, compression.

Pure functions: bytes in, typed request out; outputs in, bytes out. Error texts and
status codes follow Triton's (docs/triton-spec.md §1.2, §1.7).
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from typing import Any

import numpy as np
import orjson
import rapidjson

from inference.types import InputTensor, OutputTensor, ParsedRequest, RequestedOutput
from services.gateway.http.json_data import json_tensor_bytes
from services.gateway.tensor_limits import check_json_byte_size, check_shape
from shared.config.datatypes import DATATYPES, element_count, element_size, numpy_dtype
from shared.config.model_config import ModelSpec
from shared.errors import ShoalError, internal, invalid, unsupported

RESERVED_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output"}
)


UNSUPPORTED_COMPRESSION = "Unsupported compression type"  # answered with the encodings it takes


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise unsupported(UNSUPPORTED_COMPRESSION)
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise invalid(f"failed to decompress the request body: {exc}") from None
    if len(out) > limit:
        raise decompressed_size_error(limit)
    return out


_USE_FLAG = "Use --http-max-input-size to increase the limit."


def size_error(size: int, limit: int) -> ShoalError:
    return invalid(
        f"request JSON size of {size} bytes exceeds the maximum allowed input size of {limit} bytes. {_USE_FLAG}"
    )


def raw_size_error(size: int, limit: int) -> ShoalError:
    """A raw binary body (`Inference-Header-Content-Length: 0`): Triton's EVBufferToRawInput."""
    return invalid(
        f"Raw input has a byte_size ({size} bytes) that exceeds the maximum allowed value of {limit} bytes. "
        + _USE_FLAG
    )


def decompressed_size_error(limit: int) -> ShoalError:
    """Inflating stops at the limit, as Triton's DataCompressor: the full size is not known."""
    return invalid(f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. {_USE_FLAG}")


MAX_JSON_DEPTH = 100


def load_json(body: bytes | memoryview, depth_limit: bool = True) -> Any:
    """A request body as JSON, parsed first as Triton parses it (a body that is not JSON gets the
    parser's error, whatever its brackets); then, with `depth_limit`, Triton's nesting limit (400).

    Without `depth_limit` (Triton's control APIs read only their own top-level fields) a body
    nested deeper than the parser's own limit is read with its deep parts as null, so the handler
    still answers for the fields it reads (issue 28 items 5 and 18)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in exc.msg:  # orjson's recursion limit (1024): JSON, deeper than Triton reads data
            if depth_limit:
                raise depth_error() from None
            return orjson.loads(shallow(bytes(body)))
        doc = _load_non_utf8(body, exc)
    if depth_limit:
        check_depth(body)
    return doc


def _load_non_utf8(body: bytes | memoryview, error: orjson.JSONDecodeError) -> Any:
    """Triton's parser takes strings' bytes as they are (BYTES elements need not be UTF-8): the
    stdlib parser keeps undecodable bytes as surrogate escapes, encoded back in BYTES."""
    if "utf-8" in error.msg.lower():
        try:
            return json.loads(bytes(body).decode("utf-8", errors="surrogateescape"))
        except ValueError:
            pass
    try:
        text = parse_error_text(bytes(body), error)
    except RecursionError:  # python-rapidjson's own limit (1,000 levels): far past Triton's 100 anyway
        raise depth_error() from None
    raise internal(text) from None


# where the first byte already tells rapidjson's answer (it stops at a NUL that Triton reads past)
_JSON_VALUE_START = frozenset(b'{["-0123456789tfn')


def parse_error_text(body: bytes, error: ValueError) -> str:
    """Triton's `failed to parse the request JSON buffer: <what> at <offset>` (triton_json.h), in
    the words and offset of rapidjson, Triton's parser, asked only for a body orjson refused."""
    start = len(body) - len(body.lstrip(b" \t\r\n"))
    if start == len(body):
        return f"failed to parse the request JSON buffer: The document is empty. at {start}"
    if body[start] not in _JSON_VALUE_START:
        return f"failed to parse the request JSON buffer: Invalid value. at {start}"
    try:
        rapidjson.loads(body, allow_nan=False)  # Triton parses with rapidjson's default flags: no NaN
    except rapidjson.JSONDecodeError as exc:
        found = _RAPIDJSON_ERROR.match(str(exc))
        if found:
            return f"failed to parse the request JSON buffer: {found['what']} at {found['offset']}"
    except ValueError:  # python-rapidjson reads UTF-8 only; Triton's does not check it
        pass
    if isinstance(error, json.JSONDecodeError):  # the stdlib's, for a body that is not UTF-8
        return f"failed to parse the request JSON buffer: {error.msg}. at {error.pos}"
    return f"failed to parse the request JSON buffer: {error}"


_RAPIDJSON_ERROR = re.compile(r"Parse error at offset (?P<offset>\d+): (?P<what>.*)", re.DOTALL)


def depth_error() -> ShoalError:
    return invalid(f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})")


def check_depth(body: bytes | memoryview) -> None:
    """Triton refuses JSON nested deeper than 100 levels. Counting brackets is cheap; only a
    body with more than 100 of them is walked (strings removed, running depth by numpy)."""
    raw = bytes(body)
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return
    structure = _STRINGS.sub(b"", raw).translate(None, _NOT_BRACKETS)
    steps = np.frombuffer(structure, dtype=np.uint8)
    depth = np.cumsum(np.where((steps == ord("[")) | (steps == ord("{")), 1, -1), dtype=np.int64)
    if depth.size and int(depth.max()) > MAX_JSON_DEPTH:
        raise depth_error()


SHALLOW_DEPTH = 64


def shallow(raw: bytes, keep: int = SHALLOW_DEPTH) -> bytes:
    """`raw` with every array or object nested deeper than `keep` replaced by `null` (the parts
    removed are not checked for syntax: nothing reads them)."""
    blanked = _STRINGS.sub(lambda m: b'"' + b" " * (len(m.group()) - 2) + b'"', raw)  # brackets in strings
    chars = np.frombuffer(blanked, dtype=np.uint8)
    opens = (chars == ord("[")) | (chars == ord("{"))
    closes = (chars == ord("]")) | (chars == ord("}"))
    depth = np.cumsum(opens.astype(np.int64) - closes)
    deep = np.concatenate(([False], (depth > keep) | (closes & (depth == keep)), [False])).astype(np.int8)
    edges = np.diff(deep)
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    parts, at = [], 0
    for start, end in zip(starts.tolist(), ends.tolist()):
        parts += [raw[at:start], b"null"]
        at = end
    parts.append(raw[at:])
    return b"".join(parts)


_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """Split the JSON header from the binary section (`Inference-Header-Content-Length`)."""
    if header_length is None:
        return body, memoryview(b"")
    try:
        length = int(header_length)
    except ValueError:
        length = -1
    if length < 0 or length > len(body):
        raise invalid(f"inference header size should be in range (0, {len(body)}), got: {header_length}")
    return body[:length], memoryview(body)[length:]


def _json_error(what: str, detail: str) -> ShoalError:
    # Triton tags every JSON parse/type error INTERNAL (500); kept for compatibility.
    return internal(f"Unable to parse '{what}': {detail}")


def _uint_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list):
        raise _json_error(what, "attempt to access JSON non-array or non-integer as unsigned-integer array")
    negative = False
    for v in value:  # one pass (this runs for every input of every request); bool is not an int here
        if type(v) is not int:
            raise _json_error(what, "attempt to access JSON non-array or non-integer as unsigned-integer array")
        negative = negative or v < 0
    if negative:
        raise _json_error(what, "attempt to access JSON non-unsigned-integer as unsigned-integer")
    return value


def parse_request(header: bytes, binary: memoryview, model: str) -> ParsedRequest:
    doc = load_json(header)
    if not isinstance(doc, dict):
        raise internal("failed to parse the request JSON buffer: request must be a JSON object")
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise _json_error("id", "attempt to access JSON non-string as string")
    parameters = _request_parameters(doc.get("parameters", {}))
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise _json_error("inputs", "attempt to access JSON non-array as array")
    inputs, offset = [], 0
    for raw in raw_inputs:
        tensor, offset = _parse_input(raw, binary, offset)
        inputs.append(tensor)
    if offset != len(binary):
        raise invalid(f"unexpected additional input data for model '{model}'")
    outputs = None
    if "outputs" in doc:
        if not isinstance(doc["outputs"], list):
            raise _json_error("outputs", "attempt to access JSON non-array as array")
        outputs = [_parse_output(o) for o in doc["outputs"]]
    return ParsedRequest(request_id, inputs, outputs, parameters)


def raw_request(spec: ModelSpec, body: bytes) -> ParsedRequest:
    """`Inference-Header-Content-Length: 0`: the body is the one input's bytes (§1.7.3)."""
    prefix = "[request id: <id_unknown>] "  # core's LogRequest(): a raw request carries no id
    if len(spec.inputs) != 1:
        raise invalid(
            f"{prefix}Raw request must only have 1 input (found 1) to be deduced but got {len(spec.inputs)} "
            f"inputs in '{spec.name}' model configuration"
        )
    config = spec.inputs[0]
    dims = list(config.dims)
    if config.datatype == "BYTES":
        if dims != [1]:
            raise invalid(f"{prefix}For BYTE datatype raw input '{config.name}', the model must have input shape [1]")
    elif dims.count(-1) > 1:
        raise invalid(
            f"{prefix}The shape of the raw input '{config.name}' can not be deduced because there are more than "
            "one variable-sized dimension"
        )
    elif -1 in dims:
        fixed = element_count([d for d in dims if d != -1]) * element_size(config.datatype)
        dims[dims.index(-1)] = len(body) // fixed if fixed else 0
    if config.datatype == "BYTES":  # the body is the one element's bytes, without its length prefix
        body = len(body).to_bytes(4, "little") + body
    shape = ([1] if spec.max_batch_size > 0 else []) + dims
    return ParsedRequest(
        "", [InputTensor(config.name, config.datatype, shape, body)], None, {"binary_data_output": True}
    )


def _request_parameters(params: Any) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise _json_error("parameters", "attempt to access JSON non-object as object")
    for key, value in params.items():
        if key.startswith("triton_"):
            raise invalid(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            )
        if isinstance(value, (list, dict)) or value is None:
            raise invalid(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', 'double' or 'string'."
            )
    return params


def _parse_input(raw: Any, binary: memoryview, offset: int) -> tuple[InputTensor, int]:
    if not isinstance(raw, dict):
        raise _json_error("inputs", "attempt to access JSON non-object as object")
    name = raw.get("name")
    if not isinstance(name, str):
        raise _json_error("name", "attempt to access JSON non-string as string")
    datatype = raw.get("datatype")
    if not isinstance(datatype, str):
        raise _json_error("datatype", "attempt to access JSON non-string as string")
    if datatype not in DATATYPES:
        raise invalid(f"invalid datatype '{datatype}' for input '{name}'")
    shape = _uint_list(raw.get("shape"), "shape")
    params = raw.get("parameters", {})
    if not isinstance(params, dict):
        raise _json_error("parameters", "attempt to access JSON non-object as object")
    sources = ["data"] if "data" in raw else []
    if params:
        sources += [k for k in ("binary_data_size", "shared_memory_region") if k in params]
    if len(sources) != 1:
        named = " set " + " ".join(f"'{k}'" for k in sources) if sources else " no field is set"
        raise invalid(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            f"'shared_memory_region' in 'parameters'. But{named}"
        )
    check_shape(name, shape)
    if sources[0] == "shared_memory_region":
        return InputTensor(name, datatype, shape, None, params), offset
    if sources[0] == "binary_data_size":
        size = params["binary_data_size"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise _json_error("binary_data_size", "attempt to access JSON non-unsigned-integer as unsigned-integer")
        if offset + size > len(binary):
            raise invalid(f"unexpected size for input '{name}', expecting {size} additional bytes")
        return InputTensor(name, datatype, shape, binary[offset : offset + size], params), offset + size
    if datatype != "BYTES":
        check_json_byte_size(name, datatype, shape, element_size(datatype))
    return InputTensor(name, datatype, shape, json_tensor_bytes(name, datatype, shape, raw["data"]), params), offset


def _parse_output(raw: Any) -> RequestedOutput:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise _json_error("name", "attempt to access JSON non-string as string")
    params = raw.get("parameters", {})
    if not isinstance(params, dict):
        raise _json_error("parameters", "attempt to access JSON non-object as object")
    binary = params.get("binary_data")
    classification = params.get("classification", 0)
    if not isinstance(classification, int) or classification < 0:
        raise _json_error("classification", "attempt to access JSON non-unsigned-integer as unsigned-integer")
    if "shared_memory_region" in params:
        if classification:
            raise invalid(
                f"Output can't set both 'shared_memory_region' and 'classification' for output '{raw['name']}'"
            )
        if binary:
            raise invalid(f"Output can't set both 'shared_memory_region' and 'binary_data' for output '{raw['name']}'")
    return RequestedOutput(raw["name"], None if binary is None else bool(binary), classification, params)


# -- responses ------------------------------------------------------------------------


def json_values(datatype: str, shape: list[int], data: memoryview | bytes) -> Any:
    if datatype in ("FP16", "BF16"):
        raise invalid(
            f"sending {datatype} data via JSON is not supported. Please use the binary data format for output"
        )
    if datatype == "BYTES":
        from shared.config.datatypes import deserialize_bytes

        # undecodable bytes stay surrogate escapes: written back as the same bytes (see _dumps)
        return [item.decode("utf-8", errors="surrogateescape") for item in deserialize_bytes(data)]
    return np.frombuffer(data, dtype=numpy_dtype(datatype))


def encode_response(
    model: str, version: int, request_id: str, outputs: list[OutputTensor], parameters: dict[str, Any] | None = None
) -> tuple[bytes, int | None]:
    """The response body and, when any output is binary, the JSON header length."""
    doc: dict[str, Any] = {}
    if request_id:
        doc["id"] = request_id
    doc["model_name"] = model
    doc["model_version"] = str(version)
    if parameters:
        doc["parameters"] = parameters
    entries, blobs = [], []
    for out in outputs:
        entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": out.shape}
        if out.data is None:
            pass  # in the client's shared-memory region: no data, no parameters
        elif out.binary:
            size = memoryview(out.data).nbytes
            entry["parameters"] = {"binary_data_size": size}
            blobs.append(out.data)
        else:
            entry["data"] = json_values(out.datatype, out.shape, out.data)
        entries.append(entry)
    doc["outputs"] = entries
    header = _dumps(doc)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


def _dumps(doc: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:
        # a BYTES output that is not UTF-8: Triton writes its bytes into the JSON string as they are
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), default=lambda a: a.tolist())
        return text.encode("utf-8", errors="surrogateescape")


def error_body(message: str) -> bytes:
    """Triton's `{"error": "<message>"}`. A message may name what the client sent (a request id, a
    shared-memory key) with bytes that were not UTF-8: they go back as they came (see `_dumps`)."""
    return _dumps({"error": message})


def choose_encoding(accept: str | None) -> str | None:
    """Triton's pick from Accept-Encoding: highest q among identity/deflate/gzip, first on ties."""
    if not accept:
        return None
    best, best_q = None, 0.0
    for part in accept.split(","):
        name, _, params = part.strip().partition(";")
        name = name.strip().lower()
        if name not in ("identity", "gzip", "deflate"):
            continue
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                q = 0.0
        if q > best_q:
            best, best_q = name, q
    return None if best == "identity" else best


def compress(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.compress(body, compresslevel=1)
    return zlib.compress(body, 1)
