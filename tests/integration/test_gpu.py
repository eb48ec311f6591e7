"""GPU paths through the real system on a CUDA host: client CUDA shared memory (HTTP and gRPC,
with tritonclient's own `cuda_shared_memory` utilities), Triton's `nv_gpu_*` metrics read
through NVML, and GPU counting. Every test here skips with the reason on a host without a GPU
(the TorchScript and ONNX KIND_GPU models are in test_backends.py)."""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from services.worker.gpus import available_gpus

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not available_gpus(), reason="needs a CUDA device (this host has none)"),
]


@pytest.fixture(scope="module")
def cudashm():
    """tritonclient's CUDA shared-memory utilities (they need `cuda-python` on the client)."""
    return pytest.importorskip(
        "tritonclient.utils.cuda_shared_memory", reason="tritonclient's CUDA shared memory needs cuda-python"
    )


@pytest.fixture
def regions(cudashm):
    made = []

    def make(name: str, byte_size: int, device: int = 0):
        handle = cudashm.create_shared_memory_region(name, byte_size, device)
        made.append(handle)
        return handle

    yield make
    for handle in made:
        cudashm.destroy_shared_memory_region(handle)


def _simple_through_cuda_shm(client, module, cudashm, regions):
    """Triton's simple_{http,grpc}_cudashm_client flow: inputs and outputs in GPU memory."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inp, out = regions("input_data", 128), regions("output_data", 128)
    cudashm.set_shared_memory_region(inp, [a, b])
    client.register_cuda_shared_memory("input_data", cudashm.get_raw_handle(inp), 0, 128)
    client.register_cuda_shared_memory("output_data", cudashm.get_raw_handle(out), 0, 128)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("input_data", 64)
    inputs[1].set_shared_memory("input_data", 64, offset=64)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("output_data", 64)
    outputs[1].set_shared_memory("output_data", 64, offset=64)
    result = client.infer("simple", inputs, outputs=outputs)
    # tritonclient's CUDA reader has no offset: read both outputs as rows (OUTPUT1 was written at offset 64)
    both = cudashm.get_contents_as_numpy(out, np.int32, [2, 16])
    np.testing.assert_array_equal(both, np.concatenate([a + b, a - b]))
    return result.get_response()


def test_http_inputs_and_outputs_in_cuda_shared_memory(with_shm, cudashm, regions):
    client = httpclient.InferenceServerClient(with_shm.url, network_timeout=60)
    client.unregister_cuda_shared_memory()
    try:
        response = _simple_through_cuda_shm(client, httpclient, cudashm, regions)
        assert not any("data" in o for o in response["outputs"])  # the data went to GPU memory only
        status = client.get_cuda_shared_memory_status()
        assert sorted((s["name"], s["device_id"], s["byte_size"]) for s in status) == [
            ("input_data", 0, 128),
            ("output_data", 0, 128),
        ]
        with pytest.raises(InferenceServerException) as err:
            client.register_cuda_shared_memory("input_data", cudashm.get_raw_handle(regions("again", 64)), 0, 64)
        assert "already in manager" in err.value.message()
        client.unregister_cuda_shared_memory("input_data")
        assert [s["name"] for s in client.get_cuda_shared_memory_status()] == ["output_data"]
    finally:
        client.unregister_cuda_shared_memory()
        client.close()


def test_a_handle_cuda_refuses_is_triton_s_500(with_shm, cudashm):
    import base64

    client = httpclient.InferenceServerClient(with_shm.url, network_timeout=60)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.register_cuda_shared_memory("g", base64.b64encode(bytes(64)), 0, 1024)
        assert err.value.status() == "500", err.value.message()
        assert "failed to register CUDA shared memory region 'g': failed to open CUDA IPC handle: " in (
            err.value.message()
        )
        assert client.get_cuda_shared_memory_status() == []
    finally:
        client.close()


def test_grpc_inputs_and_outputs_in_cuda_shared_memory(with_shm, cudashm, regions):
    with grpcclient.InferenceServerClient(with_shm.grpc_url) as client:
        client.unregister_cuda_shared_memory()
        try:
            response = _simple_through_cuda_shm(client, grpcclient, cudashm, regions)
            # Triton adds one raw content per output, empty for those written to shared memory
            assert list(response.raw_output_contents) == [b"", b""]
            status = client.get_cuda_shared_memory_status(as_json=True)["regions"]
            assert sorted(status) == ["input_data", "output_data"]
            assert int(status["input_data"]["byte_size"]) == 128
        finally:
            client.unregister_cuda_shared_memory()


def test_large_fp32_tensor_round_trips_through_cuda_shared_memory(with_shm, cudashm, regions):
    value = np.random.default_rng(0).standard_normal((1, 1 << 20)).astype(np.float32)
    inp, out = regions("big_in", value.nbytes), regions("big_out", value.nbytes)
    cudashm.set_shared_memory_region(inp, [value])
    client = httpclient.InferenceServerClient(with_shm.url, network_timeout=60)
    try:
        client.register_cuda_shared_memory("big_in", cudashm.get_raw_handle(inp), 0, value.nbytes)
        client.register_cuda_shared_memory("big_out", cudashm.get_raw_handle(out), 0, value.nbytes)
        tensor = httpclient.InferInput("INPUT0", list(value.shape), "FP32")
        tensor.set_shared_memory("big_in", value.nbytes)
        output = httpclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("big_out", value.nbytes)
        client.infer("identity_fp32", [tensor], outputs=[output])
        np.testing.assert_array_equal(cudashm.get_contents_as_numpy(out, np.float32, list(value.shape)), value)
    finally:
        client.unregister_cuda_shared_memory()
        client.close()


def test_nv_gpu_metrics_for_every_visible_gpu(shoal):
    with urllib.request.urlopen(shoal.metrics_url, timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    for name in (
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage",
        "nv_gpu_power_limit",
        "nv_energy_consumption",
    ):
        assert name in families, name
        uuids = [s.labels["gpu_uuid"] for s in families[name].samples]
        assert len(uuids) == len(available_gpus()) and all(u.startswith("GPU-") for u in uuids), (name, uuids)
    total = families["nv_gpu_memory_total_bytes"].samples[0].value
    assert total > 2**30 and 0 <= families["nv_gpu_memory_used_bytes"].samples[0].value <= total
    assert 0.0 <= families["nv_gpu_utilization"].samples[0].value <= 1.0
    assert families["nv_gpu_power_usage"].samples[0].value > 0 and families["nv_gpu_power_limit"].samples[0].value > 0


def test_available_gpus_match_what_cuda_sees():
    cupy = pytest.importorskip("cupy", reason="CuPy (the gpu extra) counts CUDA devices independently")
    assert available_gpus() == tuple(range(cupy.cuda.runtime.getDeviceCount()))
