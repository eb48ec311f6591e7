"""Inference through the official tritonclient: datatypes, JSON and binary, outputs, compression."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient

from tests.cluster import DTYPES
from tests.integration.test_endpoints import http


def simple_inputs(a: np.ndarray, b: np.ndarray, binary: bool = True) -> list[httpclient.InferInput]:
    inputs = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        tensor = httpclient.InferInput(name, list(value.shape), "INT32")
        tensor.set_data_from_numpy(value, binary_data=binary)
        inputs.append(tensor)
    return inputs


def sample(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(7)
    if datatype == "BYTES":
        return np.array([f"s{i}-é".encode() for i in range(int(np.prod(shape)))], dtype=object).reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    if datatype == "BF16":
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(datatype)
    if dtype is not None:
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(datatype.lower())
    return rng.integers(info.min, info.max, shape, dtype=datatype.lower(), endpoint=True)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_simple(client, binary):
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("simple", simple_inputs(a, b, binary), outputs=outputs, request_id="req-7")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response["id"] == "req-7" and response["model_name"] == "simple" and response["model_version"] == "1"


@pytest.mark.parametrize("datatype", list(DTYPES))
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_datatype_round_trips(client, datatype, binary):
    if not binary and datatype in ("FP16", "BF16"):
        pytest.skip("Triton refuses FP16/BF16 as JSON; tested in test_fp16_json_is_refused")
    value = sample(datatype, (2, 5))
    model = f"identity_{datatype.lower()}"
    tensor = httpclient.InferInput("INPUT0", list(value.shape), datatype)
    tensor.set_data_from_numpy(value, binary_data=binary)
    result = client.infer(model, [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])
    out = result.as_numpy("OUTPUT0")
    if datatype == "BYTES":
        got = [x if isinstance(x, bytes) else str(x).encode() for x in out.reshape(-1)]
        assert got == list(value.reshape(-1))
    else:
        assert out.dtype == value.dtype
        np.testing.assert_array_equal(out, value)


def test_fp16_json_is_refused(client):
    from tritonclient.utils import InferenceServerException

    tensor = httpclient.InferInput("INPUT0", [1, 2], "FP16")
    tensor.set_data_from_numpy(np.zeros((1, 2), np.float16), binary_data=False)
    with pytest.raises(InferenceServerException) as err:
        client.infer("identity_fp16", [tensor])
    assert err.value.status() == "400" and "FP16 data via JSON is not supported" in err.value.message()


def test_output_selection(client):
    a = np.ones((1, 16), dtype=np.int32)
    result = client.infer("simple", simple_inputs(a, a), outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - a)


def test_listed_output_without_binary_flag_is_json(shoal):
    body = json.dumps(
        {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                for n in ("INPUT0", "INPUT1")
            ],
            "outputs": [{"name": "OUTPUT0"}],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    status, headers, raw = http(shoal.url, "/v2/models/simple/infer", "POST", body)
    assert status == 200 and headers["content-type"] == "application/json"
    doc = json.loads(raw)
    assert doc["outputs"] == [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "data": [2 * i for i in range(16)]}
    ]


def test_nested_json_data_and_nobatch_model(client, shoal):
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [2, 3], "datatype": "FP32", "data": [[1, 2, 3], [4, 5, 6]]}]}
    ).encode()
    status, _, raw = http(shoal.url, "/v2/models/nobatch/infer", "POST", body)
    assert status == 200
    assert json.loads(raw)["outputs"][0]["data"] == [1, 2, 3, 4, 5, 6]


def test_raw_binary_request(shoal):
    value = np.arange(8, dtype=np.float32)
    status, headers, raw = http(
        shoal.url, "/v2/models/identity_fp32/infer", "POST", value.tobytes(), {"Inference-Header-Content-Length": "0"}
    )
    assert status == 200
    length = int(headers["Inference-Header-Content-Length"])
    doc = json.loads(raw[:length])
    assert doc["outputs"][0]["shape"] == [1, 8]
    np.testing.assert_array_equal(np.frombuffer(raw[length:], np.float32), value)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compression_both_ways(client, algorithm):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    result = client.infer(
        "simple", simple_inputs(a, a), request_compression_algorithm=algorithm, response_compression_algorithm=algorithm
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


def test_unsupported_content_encoding(shoal):
    status, headers, raw = http(shoal.url, "/v2/models/simple/infer", "POST", b"{}", {"Content-Encoding": "br"})
    assert status == 501 and json.loads(raw) == {"error": "Unsupported compression type"}
    assert headers["Accept-Encoding"] == "gzip, deflate"


def test_classification(client):
    a = np.array([[5, 1, 9, 3] + [0] * 12], dtype=np.int32)
    output = httpclient.InferRequestedOutput("OUTPUT0", class_count=2)
    result = client.infer("simple", simple_inputs(a, np.zeros_like(a)), outputs=[output])
    assert list(result.as_numpy("OUTPUT0").reshape(-1)) == [b"9:2", b"5:0"]


def test_custom_parameters_accepted_and_reserved_refused(shoal):
    base = {
        "inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": [0] * 16} for n in ("INPUT0", "INPUT1")]
    }
    ok = dict(base, parameters={"my_key": "v", "n": 3})
    assert http(shoal.url, "/v2/models/simple/infer", "POST", json.dumps(ok).encode())[0] == 200
    bad = dict(base, parameters={"triton_x": 1})
    status, _, raw = http(shoal.url, "/v2/models/simple/infer", "POST", json.dumps(bad).encode())
    assert status == 400 and "reserved" in json.loads(raw)["error"]


async def test_aio_client_concurrent_requests(shoal):
    client = aioclient.InferenceServerClient(shoal.url)
    try:
        x = np.random.default_rng(1).standard_normal((1, 256)).astype(np.float32)

        async def one():
            tensor = aioclient.InferInput("INPUT0", [1, 256], "FP32")
            tensor.set_data_from_numpy(x)
            return (await client.infer("mlp", [tensor])).as_numpy("OUTPUT0")

        import asyncio

        results = await asyncio.gather(*(one() for _ in range(32)))
        for r in results:
            np.testing.assert_allclose(r, results[0], rtol=1e-5)
    finally:
        await client.close()
