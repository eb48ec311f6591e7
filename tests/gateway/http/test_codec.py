from __future__ import annotations

import gzip
import json
import zlib

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference import classification, types
from services.gateway.http import codec
from shared.config.model_config import ModelSpec, TensorSpec
from shared.errors import ShoalError


def test_binary_inputs_follow_json_in_order():
    header = json.dumps(
        {
            "id": "r1",
            "inputs": [
                {"name": "A", "shape": [2], "datatype": "INT32", "parameters": {"binary_data_size": 8}},
                {"name": "B", "shape": [1], "datatype": "FP32", "data": [1.5]},
                {"name": "C", "shape": [1], "datatype": "UINT8", "parameters": {"binary_data_size": 1}},
            ],
            "outputs": [{"name": "O", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + np.array([1, 2], np.int32).tobytes() + b"\x07"
    head, binary = codec.split_body(body, str(len(header)))
    parsed = codec.parse_request(head, binary, "m")
    assert parsed.id == "r1"
    assert bytes(parsed.inputs[0].data) == np.array([1, 2], np.int32).tobytes()
    assert bytes(parsed.inputs[1].data) == np.array([1.5], np.float32).tobytes()
    assert bytes(parsed.inputs[2].data) == b"\x07"
    assert parsed.outputs[0].binary is True


def test_only_one_data_source():
    doc = {
        "inputs": [{"name": "A", "shape": [1], "datatype": "INT32", "data": [1], "parameters": {"binary_data_size": 4}}]
    }
    with pytest.raises(ShoalError) as err:
        codec.parse_request(json.dumps(doc).encode(), memoryview(bytes(4)), "m")
    assert err.value.message.startswith("Input must set only one of the following fields")


def test_json_bytes_and_bool():
    assert codec.json_tensor_bytes("S", "BYTES", [2], ["ab", "é"]) == b"\x02\x00\x00\x00ab\x02\x00\x00\x00\xc3\xa9"
    assert codec.json_tensor_bytes("B", "BOOL", [2], [[True], [False]]) == b"\x01\x00"
    with pytest.raises(ShoalError):
        codec.json_tensor_bytes("B", "BOOL", [1], [1])
    # as Triton: read as int64, narrowed (wrapping); a float for an integer type is refused
    assert codec.json_tensor_bytes("I", "INT8", [1], [300]) == b"\x2c"
    with pytest.raises(ShoalError) as err:
        codec.json_tensor_bytes("I", "INT8", [1], [1.5])
    assert err.value.http_status == 500


def test_header_length_range():
    with pytest.raises(ShoalError) as err:
        codec.split_body(b"{}", "5")
    assert err.value.message == "inference header size should be in range (0, 2), got: 5"


def test_response_binary_layout():
    outs = [
        types.OutputTensor("A", "INT32", [2], np.array([1, 2], np.int32).tobytes(), True),
        types.OutputTensor("B", "FP32", [1], np.array([0.5], np.float32).tobytes(), False),
        types.OutputTensor("C", "BYTES", [1], b"\x01\x00\x00\x00z", True),
    ]
    body, length = codec.encode_response("m", 3, "id9", outs)
    doc = orjson.loads(body[:length])
    assert list(doc) == ["id", "model_name", "model_version", "outputs"]
    assert doc["model_version"] == "3"
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert doc["outputs"][1]["data"] == [0.5]
    assert body[length:] == np.array([1, 2], np.int32).tobytes() + b"\x01\x00\x00\x00z"


def test_json_only_response_has_no_header_length():
    body, length = codec.encode_response(
        "m", 1, "", [types.OutputTensor("S", "BYTES", [1], b"\x02\x00\x00\x00hi", False)]
    )
    assert length is None and orjson.loads(body)["outputs"][0]["data"] == ["hi"]


@pytest.mark.parametrize(
    "accept, expected",
    [
        (None, None),
        ("gzip, deflate, br", "gzip"),
        ("deflate;q=0.5, gzip;q=0.4", "deflate"),
        ("identity", None),
        ("br", None),
        ("gzip;q=0", None),
    ],
)
def test_choose_encoding(accept, expected):
    assert codec.choose_encoding(accept) == expected


def test_decompress_and_limits():
    assert codec.decompress(gzip.compress(b"abc"), "gzip", 10) == b"abc"
    assert codec.decompress(zlib.compress(b"abc"), "deflate", 10) == b"abc"
    with pytest.raises(ShoalError) as err:
        codec.decompress(gzip.compress(b"x" * 100), "gzip", 10)
    assert err.value.message.startswith("Decompressed data size exceeds the maximum allowed value of 10 bytes.")
    with pytest.raises(ShoalError) as err:
        codec.decompress(b"abc", "br", 10)
    assert err.value.http_status == 501


def test_classification_per_batch_row():
    values = np.array([[0.1, 0.7, 0.2], [3.0, 1.0, 2.0]], np.float32)
    out = classification.classify(types.OutputTensor("O", "FP32", [2, 3], values.tobytes(), False), 2, batching=True)
    from shared.config.datatypes import deserialize_bytes

    assert out.shape == [2, 2]
    assert list(deserialize_bytes(out.data)) == [b"0.700000:1", b"0.200000:2", b"3.000000:0", b"2.000000:2"]


async def test_cache_key_includes_shapes_and_evicts_by_bytes():
    from inference.cache import ResponseCache, cache_key
    from inference.validation import Validated

    valid = Validated(1, "", [], {})
    a = codec.ParsedRequest("", [types.InputTensor("X", "FP32", [1, 4], bytes(16))], None, {})
    b = codec.ParsedRequest("", [types.InputTensor("X", "FP32", [2, 2], bytes(16))], None, {})
    assert cache_key("m", 1, a, valid) != cache_key("m", 1, b, valid)
    assert cache_key("m", 1, a, valid) == cache_key("m", 1, a, valid)
    cache = ResponseCache(max_bytes=32)
    out = [types.OutputTensor("Y", "FP32", [1, 4], bytes(16), True)]
    await cache.put(b"k1", out)
    await cache.put(b"k2", out)
    assert await cache.get(b"k1") is not None  # k1 is now the most recent
    await cache.put(b"k3", out)  # evicts the least recently used: k2
    assert await cache.get(b"k2") is None and await cache.get(b"k1") is not None and cache.bytes == 32


# -- issue 28 items 5 and 18: parse first, then the nesting limit ----------------------------------
@settings(max_examples=60)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(), c, max_size=4),
        max_leaves=20,
    )
)
def test_shallow_keeps_json_within_its_depth(doc):
    raw = orjson.dumps(doc)
    assert orjson.loads(codec.shallow(raw, keep=1000)) == doc


def test_shallow_cuts_only_what_is_deeper():
    raw = b'{"a": [[["x", "]"]]], "b": "[[[", "c": [1, [2]]}'
    assert orjson.loads(codec.shallow(raw, keep=2)) == {"a": [None], "b": "[[[", "c": [1, None]}


def test_a_body_that_is_not_json_gets_rapidjsons_words():
    for body, text in [
        (b"\x00[[[", "Invalid value. at 0"),
        (b"  ", "The document is empty. at 2"),
        (b" x", "Invalid value. at 1"),
    ]:
        with pytest.raises(ShoalError) as err:
            codec.load_json(body)
        assert err.value.message == f"failed to parse the request JSON buffer: {text}"
    deep = b"[" * 2000 + b"]" * 2000
    with pytest.raises(ShoalError, match="JSON nesting depth exceeds maximum allowed limit"):
        codec.load_json(deep)
    read = codec.load_json(b'{"r": ' + deep + b', "s": 1}', depth_limit=False)  # past orjson's own limit
    assert isinstance(read["r"], list) and read["s"] == 1


def test_a_broken_body_nested_past_rapidjsons_limit_gets_the_depth_error():
    """rapidjson, asked for the words of a body orjson refused, stops past 1,000 levels with a
    RecursionError (found by tests/gateway/fuzz/): Triton's depth error, not an unhandled one."""
    for body in (b"[" * 1001 + b"1", b'{"a":' * 3000):
        with pytest.raises(ShoalError, match="JSON nesting depth exceeds maximum allowed limit"):
            codec.load_json(body)


def _raw_spec(*inputs: TensorSpec, max_batch_size: int = 4) -> ModelSpec:
    return ModelSpec("r", "", "onnxruntime", max_batch_size, inputs, (), None, 1, "KIND_CPU", False, "")


def test_raw_request_deduces_the_one_inputs_shape():
    parsed = codec.raw_request(_raw_spec(TensorSpec("X", "FP32", (-1,))), bytes(12))
    assert parsed.inputs[0].shape == [1, 3] and parsed.binary_data_output
    unbatched = codec.raw_request(_raw_spec(TensorSpec("X", "FP32", (2, -1)), max_batch_size=0), bytes(24))
    assert unbatched.inputs[0].shape == [2, 3]


def test_raw_request_gives_a_bytes_input_its_length_prefix():
    parsed = codec.raw_request(_raw_spec(TensorSpec("S", "BYTES", (1,))), b"abc")
    assert parsed.inputs[0].shape == [1, 1] and bytes(parsed.inputs[0].data) == b"\x03\x00\x00\x00abc"


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ((TensorSpec("X", "FP32", (-1,)), TensorSpec("Y", "INT32", (2,))), "Raw request must only have 1 input"),
        ((TensorSpec("X", "FP32", (-1, -1)),), "can not be deduced because there are more than one"),
        ((TensorSpec("S", "BYTES", (2,)),), "For BYTE datatype raw input 'S', the model must have input shape [1]"),
    ],
)
def test_raw_request_refuses_what_triton_can_not_deduce(inputs, message):
    with pytest.raises(ShoalError) as err:
        codec.raw_request(_raw_spec(*inputs), bytes(8))
    assert err.value.message.startswith("[request id: <id_unknown>] ") and message in err.value.message


def test_an_error_naming_bytes_that_are_not_utf8_gives_them_back_as_sent():
    """A request id read from a body that is not UTF-8 keeps its bytes as surrogate escapes; an
    error naming it made orjson raise, and the client got no answer (found by tests/gateway/fuzz/)."""
    parsed = codec.parse_request(b'{"id": "\xff\xfe(", "inputs": []}', memoryview(b""), "m")
    body = codec.error_body(f"[request id: {parsed.id}] expected 2 inputs but got 0")
    assert body == b'{"error":"[request id: \xff\xfe(] expected 2 inputs but got 0"}'
    assert codec.error_body('plain "text"') == b'{"error":"plain \\"text\\""}'
