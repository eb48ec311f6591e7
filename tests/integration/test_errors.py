"""Bad input gets Triton's error and status, and the server keeps serving afterwards."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.test_endpoints import http
from tests.integration.test_infer import simple_inputs

INFER = "/v2/models/simple/infer"


def good_body() -> bytes:
    return json.dumps(
        {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                for n in ("INPUT0", "INPUT1")
            ]
        }
    ).encode()


def error_of(raw: bytes) -> str:
    doc = json.loads(raw)
    assert set(doc) == {"error"}
    return doc["error"]


@pytest.fixture(autouse=True)
def still_serving(shoal):
    yield
    status, _, _ = http(shoal.url, INFER, "POST", good_body())
    assert status == 200, "the server must keep serving after a bad request"


def test_malformed_json(shoal):
    status, _, raw = http(shoal.url, INFER, "POST", b'{"inputs": [')
    assert status == 500  # Triton's quirk: JSON parse errors are INTERNAL
    assert error_of(raw).startswith("failed to parse the request JSON buffer")


def test_negative_dimension(shoal):
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, -16], "datatype": "INT32", "data": [0] * 16}]})
    status, _, raw = http(shoal.url, INFER, "POST", body.encode())
    assert status == 500 and "Unable to parse 'shape'" in error_of(raw)


@pytest.mark.parametrize("length", ["9999", "-3", "abc"])
def test_wrong_inference_header_content_length(shoal, length):
    status, _, raw = http(shoal.url, INFER, "POST", good_body(), {"Inference-Header-Content-Length": length})
    assert status == 400 and error_of(raw).startswith("inference header size should be in range")


def test_binary_bytes_left_over_or_missing(shoal):
    header = json.dumps(
        {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}}
                for n in ("INPUT0", "INPUT1")
            ]
        }
    ).encode()
    extra = {"Inference-Header-Content-Length": str(len(header))}
    status, _, raw = http(shoal.url, INFER, "POST", header + bytes(64 * 2 + 4), extra)
    assert status == 400 and error_of(raw) == "unexpected additional input data for model 'simple'"
    status, _, raw = http(shoal.url, INFER, "POST", header + bytes(64), extra)
    assert status == 400 and "unexpected size for input 'INPUT1'" in error_of(raw)


def test_wrong_dtype(client):
    inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(np.zeros((1, 16), np.float32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", inputs)
    assert err.value.status() == "400"
    assert "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'" in err.value.message()


def test_wrong_shape_and_batch(client):
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", simple_inputs(np.zeros((1, 8), np.int32), np.zeros((1, 8), np.int32)))
    assert err.value.status() == "400" and "unexpected shape for input 'INPUT0'" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", simple_inputs(np.zeros((9, 16), np.int32), np.zeros((9, 16), np.int32)))
    assert "inference request batch-size must be <= 8 for 'simple'" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", simple_inputs(np.zeros((2, 16), np.int32), np.zeros((3, 16), np.int32)))
    assert "input 'INPUT1' batch size does not match other inputs for 'simple'" in err.value.message()


def test_missing_and_unknown_inputs_and_outputs(client):
    a = np.zeros((1, 16), np.int32)
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", simple_inputs(a, a)[:1])
    assert err.value.status() == "400"
    assert "expected 2 inputs but got 1 inputs for model 'simple'" in err.value.message()
    extra = httpclient.InferInput("BOGUS", [1, 16], "INT32")
    extra.set_data_from_numpy(a)
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", simple_inputs(a, a) + [extra])
    assert "unexpected inference input 'BOGUS' for model 'simple'" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", simple_inputs(a, a), outputs=[httpclient.InferRequestedOutput("NOPE")])
    assert "unexpected inference output 'NOPE' for model 'simple'" in err.value.message()


def test_byte_size_mismatch(shoal):
    header = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 60}},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}},
            ]
        }
    ).encode()
    status, _, raw = http(
        shoal.url, INFER, "POST", header + bytes(124), {"Inference-Header-Content-Length": str(len(header))}
    )
    assert status == 400
    assert "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60" in error_of(raw)


def test_json_element_count_mismatch(shoal):
    body = json.dumps(
        {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "INT32", "data": [1, 2, 3]} for n in ("INPUT0", "INPUT1")
            ]
        }
    )
    status, _, raw = http(shoal.url, INFER, "POST", body.encode())
    assert (status, error_of(raw)) == (400, "Failed to parse 'data' field: shape does not match true shape")


def test_unknown_model_and_version(client):
    a = np.zeros((1, 16), np.int32)
    with pytest.raises(InferenceServerException) as err:
        client.infer("no_such_model", simple_inputs(a, a))
    assert err.value.status() == "404"
    assert err.value.message() == "Request for unknown model: 'no_such_model' is not found"
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", simple_inputs(a, a), model_version="3")
    assert err.value.status() == "404"
    assert err.value.message() == "Request for unknown model: 'simple' version 3 is not found"
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("broken_config")
    assert err.value.status() == "404" and "has no available versions" in err.value.message()


def test_unavailable_version_is_503(client):
    with pytest.raises(InferenceServerException) as err:
        client.get_model_config("bad_io", "1")
    assert err.value.status() == "503"
    assert err.value.message() == "Request for unknown model: 'bad_io' version 1 is not at ready state"


def test_oversize_body(shoal):
    limit = shoal.cluster.gateway.http_max_input_size
    body = b'{"inputs": []}' + b" " * limit
    status, _, raw = http(shoal.url, INFER, "POST", body)
    assert status == 400
    assert error_of(raw).startswith(f"request JSON size of {len(body)} bytes exceeds the maximum allowed input size")


def test_gzip_bomb_is_capped(shoal):
    import gzip

    limit = shoal.cluster.gateway.http_max_input_size
    bomb = gzip.compress(b" " * (limit + 10))
    status, _, raw = http(shoal.url, INFER, "POST", bomb, {"Content-Encoding": "gzip"})
    assert status == 400 and error_of(raw).startswith(
        f"Decompressed data size exceeds the maximum allowed value of {limit}"
    )


def test_wrong_json_types(shoal):
    cases = [
        {"inputs": "nope"},
        {"inputs": [{"name": 3, "shape": [1], "datatype": "INT32", "data": [1]}]},
        {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": ["x"] * 16}]},
        {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32"}]},
        [1, 2, 3],
    ]
    for body in cases:
        status, _, raw = http(shoal.url, INFER, "POST", json.dumps(body).encode())
        assert status in (400, 500), body
        assert error_of(raw)
