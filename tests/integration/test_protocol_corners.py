"""HTTP protocol corners a Triton user hits (issue 16, items 7-10, 12, 13), over raw HTTP and
tritonclient against the real services. Texts and statuses: docs/compatibility.md."""

from __future__ import annotations

import json
import random
import socket
from http.client import HTTPResponse

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.test_endpoints import http
from tests.integration.test_errors import error_of, good_body

INFER = "/v2/models/simple/infer"


def infer_json(url: str, model: str, inputs: list[dict], **extra) -> tuple[int, bytes]:
    status, _, raw = http(url, f"/v2/models/{model}/infer", "POST", json.dumps({"inputs": inputs, **extra}).encode())
    return status, raw


def int32_input(name: str, data, shape=(1, 16)) -> dict:
    return {"name": name, "shape": list(shape), "datatype": "INT32", "data": data}


# -- item 7: JSON data parsing ---------------------------------------------------------------
@pytest.mark.parametrize(
    "data, status, message",
    [
        (list(range(15)), 400, "Failed to parse 'data' field: shape does not match true shape"),  # qa/L0_http
        (list(range(17)), 400, "Unable to parse 'data': Shape does not match true shape of 'data' field"),
        (["x"] * 16, 500, "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
        ([1.5] * 16, 500, "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
        ([True] * 16, 500, "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
        ([[[1] * 16]], None, None),  # nested lists are walked row-major, as Triton does
        ([[1] * 8, [1] * 8], None, None),
    ],
)
def test_json_data_errors_have_tritons_texts(shoal, data, status, message):
    got, raw = infer_json(shoal.url, "simple", [int32_input("INPUT0", data), int32_input("INPUT1", list(range(16)))])
    if status is None:
        assert got == 200, raw
        return
    assert (got, error_of(raw)) == (status, message)


def test_json_data_kinds_per_datatype(shoal):
    cases = [
        ("identity_bool", "BOOL", [1, 0], "attempt to access JSON non-boolean as boolean"),
        ("identity_uint8", "UINT8", [-1, 2], "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ("identity_fp64", "FP64", ["1", 2], "attempt to access JSON non-number as double"),
        (
            "identity_bytes",
            "BYTES",
            [1, 2],
            "Unable to parse JSON bytes array: attempt to access JSON non-string as string",
        ),
    ]
    for model, datatype, data, message in cases:
        got, raw = infer_json(
            shoal.url, model, [{"name": "INPUT0", "shape": [1, 2], "datatype": datatype, "data": data}]
        )
        assert got == 500 and error_of(raw).endswith(message), (model, raw)
    got, raw = infer_json(
        shoal.url, "identity_bool", [{"name": "INPUT0", "shape": [1, 2], "datatype": "BOOL", "data": [True, False]}]
    )
    assert got == 200 and json.loads(raw)["outputs"][0]["data"] == [True, False]


# -- item 8: element counts that overflow int64 ------------------------------------------------
@pytest.mark.parametrize("shape", [[2**62, 4], [2**40, 2**40], [0, 2**63]])
def test_shape_overflowing_int64_is_400(shoal, shape):
    header = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "parameters": {"binary_data_size": 0}}]}
    ).encode()
    status, _, raw = http(
        shoal.url,
        "/v2/models/identity_fp32/infer",
        "POST",
        header,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert status == 400, raw
    assert error_of(raw) == (  # issue 28 item 3: Triton's text (http_server.cc, GetElementCount's -3)
        f"invalid shape for input 'INPUT0': shape [{shape[0]},{shape[1]}] causes total element count "
        "to exceed maximum size of 9223372036854775807"
    )


def test_json_byte_size_overflowing_int64_gets_tritons_text(shoal):
    """qa/L0_http test_overflow's second payload (issue 38 item 3): [4, 2**60 + 2] FP32 elements fit
    int64, their bytes do not; Triton checks that before it reads `data` (http_server.cc)."""
    shape = [2**2, 2**60 + 2]
    got, raw = infer_json(
        shoal.url, "identity_fp32", [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [1.0]}]
    )
    assert got == 400, raw
    assert error_of(raw) == (
        f"byte size overflow for input 'INPUT0': element count ({4 * (2**60 + 2)}) * data type size (4) "
        "exceeds maximum allowed size (9223372036854775807)"
    )


# -- item 9: an output asked for twice ---------------------------------------------------------
def test_same_output_twice_is_400(client):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT0")]
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", inputs, outputs=outputs)
    assert err.value.status() == "400"
    assert err.value.message() == "[request id: <id_unknown>] output 'OUTPUT0' already exists in request"


# -- item 10: nesting depth and the index body -------------------------------------------------
def nested(depth: int) -> bytes:
    return b'{"a":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


@pytest.mark.parametrize("path", [INFER, "/v2/repository/models/simple/load", "/v2/repository/models/x/unload"])
def test_json_nested_too_deep_is_refused(shoal, path):
    status, _, raw = http(shoal.url, path, "POST", nested(101))
    assert (status, error_of(raw)) == (400, "JSON nesting depth exceeds maximum allowed limit (100)")
    # exactly the limit is parsed (and then refused for what it says, not for its depth)
    status, _, raw = http(shoal.url, path, "POST", nested(100))
    assert "nesting depth" not in raw.decode()
    # brackets inside strings do not count
    deep_text = json.dumps({"id": "[" * 500, "inputs": json.loads(good_body())["inputs"]}).encode()
    if path == INFER:
        assert http(shoal.url, path, "POST", deep_text)[0] == 200


@pytest.mark.parametrize("depth", [2, 101, 250_000])
def test_repository_index_ready_must_be_boolean_however_deep(shoal, depth):
    """Issue 28 item 5: the index reads `ready` with no nesting limit (Triton's HandleRepositoryIndex)."""
    ready = b"[" * depth + b"]" * depth
    for body in (b'{"ready": "yes"}', b'{"ready": ' + ready + b"}"):
        status, _, raw = http(shoal.url, "/v2/repository/index", "POST", body)
        assert (status, error_of(raw)) == (400, "Invalid value for 'ready': expected a boolean")
    status, _, raw = http(shoal.url, "/v2/repository/index", "POST", b'{"other": ' + ready + b', "ready": true}')
    assert status == 200 and ("simple", "READY") in {(e["name"], e.get("state")) for e in json.loads(raw)}
    assert http(shoal.url, "/v2/health/live")[0] == 200


# -- issue 28 item 18: a body that is not JSON -----------------------------------------------------
@pytest.mark.parametrize("path", [INFER, "/v2/repository/index", "/v2/repository/models/simple/load"])
def test_random_bytes_get_the_parsers_error_not_the_depth_limit(shoal, path):
    noise = bytes(random.Random(28).randrange(256) for _ in range(4096)) + b"[" * 300  # brackets too
    status, _, raw = http(shoal.url, path, "POST", b"\x8f" + noise)
    assert (status, error_of(raw)) == (500, "failed to parse the request JSON buffer: Invalid value. at 0")
    status, _, raw = http(shoal.url, path, "POST", b'{"inputs": [')
    assert status == 500 and error_of(raw).startswith("failed to parse the request JSON buffer: ")


@pytest.mark.parametrize(
    "body, text",  # tritonserver 2.51's answers to the same curl -d (its parser is rapidjson)
    [
        (b'{"inputs": [}', "Invalid value. at 12"),
        (b'{"inputs": []', "Missing a comma or '}' after an object member. at 13"),
        (b'{"inputs" []}', "Missing a colon after a name of object member. at 10"),
        (b'{"inputs": []} x', "The document root must not be followed by other values. at 15"),
    ],
)
def test_malformed_json_gets_tritons_parser_words(shoal, body, text):
    status, _, raw = http(shoal.url, INFER, "POST", body)
    assert (status, error_of(raw)) == (500, f"failed to parse the request JSON buffer: {text}")


# -- item 12: chunked raw binary request -------------------------------------------------------
def raw_exchange(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    host, port = url.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        response = HTTPResponse(sock)
        response.begin()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


@pytest.mark.parametrize("with_content_length", [False, True])
def test_chunked_raw_binary_request_is_served(shoal, with_content_length):
    """Triton's qa (test_content_encoding_chunked_manually): the client chunk-encodes the body
    itself and sends `Transfer-Encoding: chunked` (requests adds a Content-Length as well)."""
    payload = np.arange(8, dtype=np.float32).tobytes()
    chunked = f"{len(payload):X}\r\n".encode() + payload + b"\r\n0\r\n\r\n"
    lines = [
        "POST /v2/models/identity_fp32/infer HTTP/1.1",
        f"Host: {shoal.url}",
        "Inference-Header-Content-Length: 0",
        "Transfer-Encoding: chunked",
    ]
    if with_content_length:
        lines.append(f"Content-Length: {len(chunked)}")
    status, headers, body = raw_exchange(shoal.url, ("\r\n".join(lines) + "\r\n\r\n").encode() + chunked)
    assert status == 200, body
    header_size = int(headers["inference-header-content-length"])
    assert body[header_size:] == payload


# -- item 13: BYTES through raw binary, JSON and binary -----------------------------------------
def test_raw_binary_single_bytes_element(shoal):
    element = "one élément, no length prefix".encode()  # onnxruntime's Python API takes text only
    status, headers, raw = http(
        shoal.url, "/v2/models/identity_bytes_1/infer", "POST", element, {"Inference-Header-Content-Length": "0"}
    )
    assert status == 200, raw
    header_size = int(headers["Inference-Header-Content-Length"])
    assert json.loads(raw[:header_size])["outputs"][0]["shape"] == [1, 1]
    assert raw[header_size:] == len(element).to_bytes(4, "little") + element  # Triton's BYTES tensor
    status, _, raw = http(
        shoal.url, "/v2/models/identity_bytes/infer", "POST", element, {"Inference-Header-Content-Length": "0"}
    )
    assert (status, error_of(raw)) == (
        400,
        "[request id: <id_unknown>] For BYTE datatype raw input 'INPUT0', the model must have input shape [1]",
    )


@pytest.mark.parametrize("headers", [{}, {"Inference-Header-Content-Length": "0"}])
def test_an_empty_infer_body_is_a_raw_request_as_in_triton(shoal, headers):
    # Triton's header length defaults to the body's length: an empty body is raw binary, and the
    # core refuses it for a two-input model (tritonserver 2.51, curl -X POST .../infer)
    status, _, raw = http(shoal.url, INFER, "POST", b"", headers)
    assert (status, error_of(raw)) == (
        400,
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced "
        "but got 2 inputs in 'simple' model configuration",
    )


UNICODE = ["héllo wörld ✓", "", 'quote " and \\ backslash', "日本語"]


def test_unicode_bytes_round_trip_through_json_and_binary(client):
    """Non-UTF-8 elements: tests/integration/test_parity_cluster.py (a python model; onnxruntime's
    Python API carries only text)."""
    data = np.array([[s.encode() for s in UNICODE]], dtype=np.object_)
    for binary in (False, True):
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data, binary_data=binary)
        result = client.infer(
            "identity_bytes", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
        )
        got = [x if isinstance(x, bytes) else x.encode() for x in result.as_numpy("OUTPUT0").reshape(-1)]
        assert got == list(data.reshape(-1))
