"""Client shared memory as Triton's examples use it: tritonclient.utils.shared_memory."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from services.worker.gpus import available_gpus
from tests.integration.test_endpoints import http


@pytest.fixture
def sclient(with_shm):
    client = httpclient.InferenceServerClient(with_shm.url, network_timeout=60)
    client.unregister_system_shared_memory()
    yield client
    client.unregister_system_shared_memory()
    client.close()


def test_simple_through_system_shared_memory(sclient, regions):
    """Triton's simple_http_shm_client flow: inputs and outputs in shared memory."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    in_key, in_handle = regions(128)
    out_key, out_handle = regions(128)
    shm.set_shared_memory_region(in_handle, [a, b])
    sclient.register_system_shared_memory("input_data", in_key, 128)
    sclient.register_system_shared_memory("output_data", out_key, 128)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("input_data", 64)
    inputs[1].set_shared_memory("input_data", 64, offset=64)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=True),
    ]
    outputs[0].set_shared_memory("output_data", 64)
    outputs[1].set_shared_memory("output_data", 64, offset=64)
    result = sclient.infer("simple", inputs, outputs=outputs)
    entries = result.get_response()["outputs"]
    assert entries == [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16]},
    ]  # no data in the response
    out0 = shm.get_contents_as_numpy(out_handle, np.int32, [1, 16])
    out1 = shm.get_contents_as_numpy(out_handle, np.int32, [1, 16], offset=64)
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)
    assert os.path.exists(f"/dev/shm/{in_key.lstrip('/')}"), "Shoal must never unlink a client's region"
    status = sclient.get_system_shared_memory_status()
    assert sorted(s["name"] for s in status) == ["input_data", "output_data"]
    assert sclient.get_system_shared_memory_status("input_data") == [
        {"name": "input_data", "key": in_key, "offset": 0, "byte_size": 128}
    ]
    sclient.unregister_system_shared_memory("input_data")
    assert [s["name"] for s in sclient.get_system_shared_memory_status()] == ["output_data"]


def test_large_input_in_shared_memory_and_output_in_body(sclient, regions):
    value = np.random.default_rng(0).standard_normal((1, 1 << 20)).astype(np.float32)
    key, handle = regions(value.nbytes)
    shm.set_shared_memory_region(handle, [value])
    sclient.register_system_shared_memory("big", key, value.nbytes)
    tensor = httpclient.InferInput("INPUT0", list(value.shape), "FP32")
    tensor.set_shared_memory("big", value.nbytes)
    np.testing.assert_array_equal(sclient.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), value)


def test_register_errors(sclient, regions, with_shm):
    key, _ = regions(64)
    with pytest.raises(InferenceServerException) as err:
        sclient.register_system_shared_memory("r", "/no_such_key_here", 64)
    assert (
        err.value.status() == "500"
        and "Unable to open shared memory region: '/no_such_key_here'" in err.value.message()
    )
    with pytest.raises(InferenceServerException) as err:
        sclient.register_system_shared_memory("r", key, 128)  # larger than the segment
    assert err.value.status() == "400" and "invalid args" in err.value.message()
    sclient.register_system_shared_memory("r", key, 64)
    with pytest.raises(InferenceServerException) as err:
        sclient.register_system_shared_memory("r", key, 64)
    assert err.value.status() == "400" and "already in manager" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        sclient.get_system_shared_memory_status("nope")
    assert err.value.status() == "404"
    sclient.unregister_system_shared_memory("nope")  # unknown names are fine
    status, _, raw = http(with_shm.url, "/v2/systemsharedmemory/region/x/register", "POST", b'{"byte_size": 8}')
    assert status == 400 and json.loads(raw)["error"] == "Shared memory register request has no 'key' field"


def test_infer_errors_write_nothing(sclient, regions):
    a = np.ones((1, 16), dtype=np.int32)
    in_key, in_handle = regions(128)
    out_key, out_handle = regions(64)
    shm.set_shared_memory_region(in_handle, [a, a])
    shm.set_shared_memory_region(out_handle, [np.full(16, 7, np.int32)])
    sclient.register_system_shared_memory("in", in_key, 128)
    sclient.register_system_shared_memory("out", out_key, 64)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("in", 64)
    inputs[1].set_shared_memory("in", 64, offset=100)  # runs past the region
    with pytest.raises(InferenceServerException) as err:
        sclient.infer("simple", inputs)
    assert (
        err.value.status() == "400"
        and "Invalid offset + byte size for shared memory region: 'in'" in err.value.message()
    )
    inputs[1].set_shared_memory("in", 64, offset=200)
    with pytest.raises(InferenceServerException) as err:
        sclient.infer("simple", inputs)
    assert "Invalid offset for shared memory region: 'in'" in err.value.message()
    inputs[1].set_shared_memory("nowhere", 64)
    with pytest.raises(InferenceServerException) as err:
        sclient.infer("simple", inputs)
    assert err.value.status() == "404" and "Unable to find shared memory region: 'nowhere'" in err.value.message()
    inputs[1].set_shared_memory("in", 64, offset=64)
    output = httpclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("out", 32)  # too small for 64 bytes of results
    with pytest.raises(InferenceServerException) as err:
        sclient.infer("simple", inputs, outputs=[output])
    assert err.value.status() == "500" and "should be at least 64 bytes" in err.value.message()
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.int32, [16]), np.full(16, 7, np.int32))


def test_disabled_by_default(shoal, regions):
    key, _ = regions(64)
    client = httpclient.InferenceServerClient(shoal.url)
    with pytest.raises(InferenceServerException) as err:
        client.register_system_shared_memory("r", key, 64)
    assert err.value.status() == "501" and "--allow-client-shm=true" in err.value.message()
    assert client.get_system_shared_memory_status() == []  # status still answers
    inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_shared_memory("r", 64)
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", inputs)
    assert err.value.status() == "501"
    client.close()


@pytest.mark.skipif(bool(available_gpus()), reason="this host has a GPU: test_gpu.py covers CUDA shared memory")
def test_cuda_register_without_gpu(sclient):
    import base64

    status_code = None
    try:
        sclient.register_cuda_shared_memory("g", base64.b64encode(bytes(64)), 0, 1024)
    except InferenceServerException as exc:
        status_code, message = exc.status(), exc.message()
    assert status_code == "400" and "GPUs not supported" in message
    with pytest.raises(InferenceServerException) as err:
        sclient.register_cuda_shared_memory("g", base64.b64encode(bytes(10)), 0, 1024)
    assert "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t" in err.value.message()
    assert sclient.get_cuda_shared_memory_status() == []
    sclient.unregister_cuda_shared_memory()


@pytest.mark.parametrize("key", ["/../../etc/hostname", "/a/b", "..", "/", "/shoal_abc_segment", "/shoal-host-id"])
def test_keys_outside_dev_shm_or_of_shoal_itself_are_refused(sclient, key):
    with pytest.raises(InferenceServerException) as err:
        sclient.register_system_shared_memory("evil", key, 8)
    # Triton's shm_open fails on a key with a '/' past the first (500 "Unable to open ...");
    # Shoal's own segments, and keys of slashes only (Triton's ValidateSharedMemoryKey), are 400
    assert err.value.status() == ("400" if "shoal" in key or key == "/" else "500"), err.value.message()
    assert sclient.get_system_shared_memory_status() == []


def test_a_region_under_a_second_name_or_a_link_is_refused(sclient, regions):
    """docs/security.md "Shared memory": a key must name a segment itself, never a hard link (perhaps
    to one of Shoal's own, renamed past the reserved prefix) nor a symbolic link (Triton's text)."""
    key, _ = regions(64)
    real = f"/dev/shm/{key.lstrip('/')}"
    alias = f"{real}_alias"
    os.link(real, alias)
    try:
        with pytest.raises(InferenceServerException) as err:
            sclient.register_system_shared_memory("aliased", key, 64)
        assert err.value.status() == "400"
        assert err.value.message() == (
            f"cannot register shared memory region 'aliased' with key '{key}': the segment has 2 names"
        )
    finally:
        os.unlink(alias)
    symlink = f"{real}_symlink"
    os.symlink(real, symlink)
    try:
        with pytest.raises(InferenceServerException) as err:
            sclient.register_system_shared_memory("linked", f"{key}_symlink", 64)
        assert err.value.status() == "500"
        assert err.value.message() == f"Unable to open shared memory region: '{key}_symlink'"
    finally:
        os.unlink(symlink)
    sclient.register_system_shared_memory("itself", key, 64)  # the segment by its own (one) name
    assert [s["name"] for s in sclient.get_system_shared_memory_status()] == ["itself"]
