"""Issue 16 items that need a server started with Triton's options: --http-max-input-size
(item 11), --http-restricted-api (15), client shared memory (17-19), and a python model for
BYTES that are not UTF-8 (13). One cluster for the module; see docs/compatibility.md."""

from __future__ import annotations

import gzip
import json
import mmap
import socket
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from services.repository import examples
from tests.cluster import running_cluster
from tests.integration.test_endpoints import http
from tests.integration.test_errors import error_of, good_body
from tests.serving import wait_until

LIMIT = 256 * 1024
RESTRICTED = ["trace,logging:admin-key=s3cret", "statistics,model-config:stats-key=abc"]

PY_IDENTITY = """
import json
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters() or "{}")
            if "marker" in params:  # tells the test the request is executing
                open(params["marker"], "w").close()
            time.sleep(float(params.get("delay", 0)))
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""


def python_model(root: Path, name: str, config_type: str, dims: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(PY_IDENTITY))
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        f'input [ {{ name: "INPUT0" data_type: {config_type} dims: {dims} }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: {config_type} dims: {dims} }} ]\n'
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = examples.write_examples(tmp_path_factory.mktemp("parity"))
    python_model(root, "py_bytes", "TYPE_STRING", "[ -1 ]")
    python_model(root, "py_slow", "TYPE_INT32", "[ 16 ]")
    with running_cluster(
        root, allow_client_shm=True, http_max_input_size=LIMIT, http_restricted_api=RESTRICTED
    ) as running:
        yield running


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.url, network_timeout=60)
    c.unregister_system_shared_memory()
    yield c
    c.unregister_system_shared_memory()
    c.close()


# -- item 11 (issue 28 item 2: Triton's texts per body kind): size limits per body kind -----------------------------------------------------
def test_oversize_raw_binary_body_gets_the_raw_message(server):
    body = bytes(LIMIT + 16)
    status, _, raw = http(
        server.url, "/v2/models/identity_fp32/infer", "POST", body, {"Inference-Header-Content-Length": "0"}
    )
    assert (status, error_of(raw)) == (
        400,
        f"Raw input has a byte_size ({len(body)} bytes) that exceeds the maximum allowed value of {LIMIT} bytes. "
        "Use --http-max-input-size to increase the limit.",
    )


def test_oversize_decompressed_body_gets_the_decompressed_message(server):
    body = gzip.compress(good_body() + b" " * LIMIT)
    assert len(body) < LIMIT
    status, _, raw = http(server.url, "/v2/models/simple/infer", "POST", body, {"Content-Encoding": "gzip"})
    assert (status, error_of(raw)) == (
        400,
        f"Decompressed data size exceeds the maximum allowed value of {LIMIT} bytes. "
        "Use --http-max-input-size to increase the limit.",
    )


def test_oversize_json_body_keeps_the_json_message(server):
    body = good_body() + b" " * LIMIT
    status, _, raw = http(server.url, "/v2/models/simple/infer", "POST", body)
    assert status == 400 and error_of(raw).startswith(f"request JSON size of {len(body)} bytes exceeds")


def test_a_far_oversize_body_is_answered_and_the_connection_serves_on(server):
    """More than 4x the limit: answered before the body ends; the rest is read and dropped, so the
    client gets the error (no reset) and its connection serves the next request."""
    body = b"{" + b" " * (5 * LIMIT) + b"}"
    host, port = server.url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        sender = threading.Thread(target=sock.sendall, args=(head.encode() + body,))
        sender.start()
        reply = sock.makefile("rb")
        status = reply.readline()
        headers = dict(line.decode().strip().split(": ", 1) for line in iter(reply.readline, b"\r\n"))
        error = json.loads(reply.read(int(headers["content-length"])))["error"]
        sender.join()
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        after = reply.readline()
    assert status.startswith(b"HTTP/1.1 400") and after.startswith(b"HTTP/1.1 200")
    assert error.startswith(f"request JSON size of {len(body)} bytes exceeds the maximum allowed input size")


# -- item 15: restricted APIs --------------------------------------------------------------------
@pytest.mark.parametrize(
    "path, method, header",
    [
        ("/v2/trace/setting", "GET", "admin-key"),
        ("/v2/models/simple/trace/setting", "GET", "admin-key"),
        ("/v2/logging", "GET", "admin-key"),
        ("/v2/models/stats", "GET", "stats-key"),
        ("/v2/models/simple/stats", "GET", "stats-key"),
        ("/v2/models/simple/config", "GET", "stats-key"),
        ("/v2/models/simple/versions/1/config", "GET", "stats-key"),
    ],
)
def test_restricted_api_needs_its_header(server, path, method, header):
    status, _, raw = http(server.url, path, method)
    assert (status, error_of(raw)) == (403, f"This API is restricted, expecting header '{header}'")
    value = "s3cret" if header == "admin-key" else "abc"
    assert http(server.url, path, method, headers={header: "wrong"})[0] == 403
    assert http(server.url, path, method, headers={header.upper(): value})[0] == 200


def test_unrestricted_apis_stay_open(server, client):
    assert client.is_server_live() and client.is_model_ready("simple")
    assert client.get_model_metadata("simple")["name"] == "simple"
    assert http(server.url, "/v2/models/simple/infer", "POST", good_body())[0] == 200
    assert http(server.url, "/v2/repository/index", "POST", b"")[0] == 200
    assert http(server.url, "/v2/systemsharedmemory/status")[0] == 200
    # tritonclient passes the header as Triton's users do
    assert client.get_model_config("simple", headers={"stats-key": "abc"})["name"] == "simple"
    with pytest.raises(InferenceServerException) as err:
        client.get_inference_statistics("simple")
    assert err.value.status() == "403"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("trace", "format is '<API_1>,<API_2>:<restricted-key>=<restricted-value>'"),
        ("tracing:k=v", "unknown restricted API category 'tracing'"),
        ("trace:k=v,trace:j=w", "one '<apis>:<key>=<value>' per flag"),
    ],
)
def test_restricted_api_flag_is_checked(spec, message):
    from shoal.cli import parse_serve

    with pytest.raises(SystemExit) as err:
        parse_serve([f"--http-restricted-api={spec}"])
    assert message in str(err.value)


# -- item 17: a region registered at a large offset into its key -------------------------------
def test_region_at_a_large_offset_reads_and_writes_the_right_bytes(client, regions):
    page = mmap.PAGESIZE
    size = page * 1024
    offset = page * 1023 + 24  # neither page- nor allocation-aligned, far into the key
    in_key, in_handle = regions(size)
    out_key, out_handle = regions(size)
    shm.set_shared_memory_region(in_handle, [np.full(size // 4, 7, np.int32)])  # garbage before the region
    a = np.arange(16, dtype=np.int32)
    b = np.full(16, 3, dtype=np.int32)
    shm.set_shared_memory_region(in_handle, [a, b], offset=offset)
    client.register_system_shared_memory("in", in_key, 128, offset=offset)
    client.register_system_shared_memory("out", out_key, 256, offset=offset)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("in", 64)
    inputs[1].set_shared_memory("in", 64, offset=64)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("out", 64, offset=128)
    outputs[1].set_shared_memory("out", 64)
    client.infer("simple", inputs, outputs=outputs)
    sums = shm.get_contents_as_numpy(out_handle, np.int32, [16], offset=offset + 128)
    diffs = shm.get_contents_as_numpy(out_handle, np.int32, [16], offset=offset)
    np.testing.assert_array_equal(sums, a + b)
    np.testing.assert_array_equal(diffs, a - b)
    untouched = shm.get_contents_as_numpy(out_handle, np.uint8, [offset])
    assert not untouched.any(), "nothing written before the region"


# -- item 18: unregister while requests use the region -----------------------------------------
def test_unregister_during_inference_lets_requests_finish(server, client, regions, tmp_path):
    in_key, in_handle = regions(64)
    out_key, out_handle = regions(64)
    data = np.arange(16, dtype=np.int32)
    shm.set_shared_memory_region(in_handle, [data])
    client.register_system_shared_memory("slow_in", in_key, 64)
    client.register_system_shared_memory("slow_out", out_key, 64)
    body = json.dumps(
        {
            "parameters": {"delay": 2, "marker": str(tmp_path / "started")},
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [16],
                    "datatype": "INT32",
                    "parameters": {"shared_memory_region": "slow_in", "shared_memory_byte_size": 64},
                }
            ],
            "outputs": [
                {"name": "OUTPUT0", "parameters": {"shared_memory_region": "slow_out", "shared_memory_byte_size": 64}}
            ],
        }
    ).encode()
    result: dict = {}

    def run() -> None:  # tritonclient.http is gevent-based: one thread per client, so raw HTTP here
        result["status"], _, result["body"] = http(server.url, "/v2/models/py_slow/infer", "POST", body)

    thread = threading.Thread(target=run)
    thread.start()
    other = httpclient.InferenceServerClient(server.url)
    wait_until(lambda: (tmp_path / "started").exists() or "status" in result)
    assert "status" not in result, result
    other.unregister_system_shared_memory()  # Triton: marked, unregistered once the request is done
    assert sorted(r["name"] for r in other.get_system_shared_memory_status()) == ["slow_in", "slow_out"]
    thread.join(60)
    assert result["status"] == 200, result
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.int32, [16]), data)
    wait_until(lambda: other.get_system_shared_memory_status() == [])
    other.close()


# -- item 19: overflowing offsets, reserved and invalid keys --------------------------------------
def test_offset_and_size_overflow_get_tritons_texts(client, regions):
    key, handle = regions(64)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32)])
    client.register_system_shared_memory("r", key, 64)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    for offset, size, message in [
        (32, 2**64 - 32, "Integer overflow detected: byte_size "),
        (2**64 - 32, 64, "Invalid offset for shared memory region: 'r'"),
        (60, 64, "Invalid offset + byte size for shared memory region: 'r'"),
    ]:
        output = httpclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("r", size, offset=offset)
        with pytest.raises(InferenceServerException) as err:
            client.infer("simple", inputs, outputs=[output])
        assert message in err.value.message() and err.value.status() == "400", err.value
    with pytest.raises(InferenceServerException) as err:
        client.register_system_shared_memory("big", key, 2**64 - 8, offset=16)
    assert "failed to register shared memory region 'big': invalid args" in err.value.message()


def test_reserved_and_invalid_keys(client, regions):
    reserved = "triton_python_backend_shm_region__my_test_shm_key"
    with pytest.raises(InferenceServerException) as err:
        client.register_system_shared_memory("my_test_shm_name", reserved, 10000)
    assert err.value.message() == (
        f"cannot register shared memory region 'my_test_shm_name' with key '{reserved}' as the key contains "
        "the reserved prefix 'triton_python_backend_shm_region_'"
    )
    with pytest.raises(InferenceServerException) as err:  # the prefix after leading slashes counts too
        client.register_system_shared_memory("my_test_shm_name", "//" + reserved, 10000)
    assert "as the key contains the reserved prefix" in err.value.message()
    for key in ("/a/b", "/.."):
        with pytest.raises(InferenceServerException) as err:
            client.register_system_shared_memory("bad", key, 8)
        assert (err.value.status(), err.value.message()) == ("500", f"Unable to open shared memory region: '{key}'")
    for key in ("/", "///"):  # issue 28 item 6: Triton's ValidateSharedMemoryKey, before shm_open
        with pytest.raises(InferenceServerException) as err:
            client.register_system_shared_memory("bad", key, 8)
        assert (err.value.status(), err.value.message()) == (
            "400",
            f"cannot register shared memory region 'bad' - invalid shm key '{key}'",
        )


# -- item 13: BYTES that are not UTF-8 ------------------------------------------------------------
ELEMENTS = [b"\xff\xfe\x00raw", "héllo ✓".encode(), b"", b'quote " and \\ backslash']


def _json_string(element: bytes) -> bytes:
    return b'"' + element.replace(b"\\", b"\\\\").replace(b'"', b'\\"').replace(b"\x00", b"\\u0000") + b'"'


def test_non_utf8_bytes_round_trip_through_json(server):
    """Triton copies a JSON string's bytes as they are: non-UTF-8 bytes come back unchanged."""
    data = b",".join(_json_string(e) for e in ELEMENTS)
    body = b'{"inputs":[{"name":"INPUT0","shape":[%d],"datatype":"BYTES","data":[%s]}]}' % (len(ELEMENTS), data)
    status, _, raw = http(server.url, "/v2/models/py_bytes/infer", "POST", body)
    assert status == 200, raw
    assert b'"data":[' + data + b"]" in raw


def test_non_utf8_bytes_round_trip_through_binary(client):
    data = np.array(ELEMENTS, dtype=np.object_)
    tensor = httpclient.InferInput("INPUT0", [len(ELEMENTS)], "BYTES")
    tensor.set_data_from_numpy(data, binary_data=True)
    result = client.infer("py_bytes", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
    assert result.as_numpy("OUTPUT0").tolist() == ELEMENTS
