"""Triton's GRPCInferenceService against the real services, through the official
`tritonclient.grpc` (sync, asyncio and streaming): answers, Triton's statuses and texts."""

from __future__ import annotations

import asyncio
import json
import queue
import time
import uuid

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from services.repository import examples
from tests.cluster import build_test_repository, running_cluster
from tests.integration.test_python_models import REPEAT, REPEAT_CONFIG, _python_model
from tests.integration.test_sequence_batcher import DIRECT, ONNX_CONFIG, onnx_accumulator
from tests.serving import wait_until


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = build_test_repository(tmp_path_factory.mktemp("grpc_models"))
    _python_model(root, "repeat", REPEAT, REPEAT_CONFIG)
    examples.write_model(root, "onnx_acc", onnx_accumulator(), ONNX_CONFIG.format(name="onnx_acc", strategy=DIRECT))
    explicit = {"model_control_mode": "explicit", "load_model": ["*"]}
    with running_cluster(root, allow_client_shm=True, repository=explicit) as running:
        running.root = root
        yield running


@pytest.fixture
def client(served):
    with grpcclient.InferenceServerClient(served.grpc_url) as c:
        yield c


def simple_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    tensors = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        tensor = grpcclient.InferInput(name, list(value.shape), "INT32")
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    return tensors


def repeat_input(values: list[int]) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, np.int32))
    return [tensor]


def error_of(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        call()
    return err.value


# -- health, metadata, config, statistics ---------------------------------------------------


def test_health_and_metadata(client, served):
    assert client.is_server_live()
    with httpclient.InferenceServerClient(served.url) as http:  # strict readiness: broken models make it False
        assert client.is_server_ready() == http.is_server_ready()
    assert client.is_model_ready("simple") and client.is_model_ready("simple", "1")
    meta = client.get_server_metadata()
    assert meta.name == "triton" and "classification" in meta.extensions
    model = client.get_model_metadata("simple")
    assert model.versions == ["1"] and model.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs][0] == ("INPUT0", "INT32", [-1, 16])
    config = client.get_model_config("simple", as_json=True)["config"]
    with httpclient.InferenceServerClient(served.url) as http:
        assert (
            config["name"] == "simple" and config["max_batch_size"] == http.get_model_config("simple")["max_batch_size"]
        )
        assert config["input"][0]["name"] == http.get_model_config("simple")["input"][0]["name"]


def test_health_and_metadata_errors(client):
    assert client.is_model_ready("nope") is False  # not an error: tritonserver 2.51, qa/L0_lifecycle
    err = error_of(lambda: client.get_model_metadata("nope"))
    assert err.status() == "StatusCode.NOT_FOUND"
    err = error_of(lambda: client.get_model_config("simple", "9"))
    assert err.status() == "StatusCode.NOT_FOUND"
    assert err.message() == "Request for unknown model: 'simple' version 9 is not found"
    err = error_of(lambda: client.get_model_metadata("simple", "x"))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"


def test_statistics(client):
    client.infer("simple", simple_inputs(*[np.ones((1, 16), np.int32)] * 2))
    stats = client.get_inference_statistics("simple", as_json=True)["model_stats"]
    assert stats[0]["name"] == "simple" and int(stats[0]["inference_stats"]["success"]["count"]) >= 1
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {"simple", "mlp"} <= {s["name"] for s in everything}
    err = error_of(lambda: client.get_inference_statistics("nope"))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and err.message() == "requested model 'nope' is not available"


# -- inference ------------------------------------------------------------------------------


def test_infer_raw_outputs_id_and_requested_outputs(client):
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.ones((1, 16), np.int32)
    result = client.infer("simple", simple_inputs(a, b), request_id="r-1")
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + b) and np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response().id == "r-1" and result.get_response().model_version == "1"
    only = client.infer("simple", simple_inputs(a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert only.as_numpy("OUTPUT0") is None and np.array_equal(only.as_numpy("OUTPUT1"), a - b)


def test_infer_typed_contents_and_bytes(served):
    """Typed `contents` (what non-Python clients send) through the raw stub."""
    with grpc.insecure_channel(served.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="simple")
        for name in ("INPUT0", "INPUT1"):
            request.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents.int_contents.extend(range(16))
        response = stub.ModelInfer(request)
        out = np.frombuffer(response.raw_output_contents[0], np.int32)
        assert list(out) == [2 * i for i in range(16)]
        words = service_pb2.ModelInferRequest(model_name="identity_bytes")
        words.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 2]).contents.bytes_contents.extend([b"a", b"bc"])
        response = stub.ModelInfer(words)
        assert response.raw_output_contents[0] == b"\x01\x00\x00\x00a\x02\x00\x00\x00bc"


def test_classification_and_parameters(client):
    values = np.array([[0.1, 0.9, 0.5, 0.2]], np.float32)
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(values)
    out = grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)
    result = client.infer("identity_fp32", [tensor], outputs=[out], parameters={"custom": "x"})
    assert [v.decode() for v in result.as_numpy("OUTPUT0").reshape(-1)] == ["0.900000:1", "0.500000:2"]


def test_large_tensor(client):
    big = np.random.default_rng(0).random((1, 4_000_000), dtype=np.float32)  # 16 MB each way
    tensor = grpcclient.InferInput("INPUT0", list(big.shape), "FP32")
    tensor.set_data_from_numpy(big)
    assert np.array_equal(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), big)


def test_infer_errors(client):
    good = simple_inputs(*[np.ones((1, 16), np.int32)] * 2)
    err = error_of(lambda: client.infer("nope", good))
    assert err.status() == "StatusCode.NOT_FOUND"
    assert err.message() == "Request for unknown model: 'nope' is not found"
    wrong = simple_inputs(*[np.ones((1, 8), np.int32)] * 2)
    err = error_of(lambda: client.infer("simple", wrong))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "unexpected shape for input 'INPUT0'" in err.message()
    err = error_of(lambda: client.infer("simple", good[:1]))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "missing required input(s) ['INPUT1']" in err.message()
    err = error_of(lambda: client.infer("repeat", repeat_input([1])))
    assert err.status() == "StatusCode.UNIMPLEMENTED"
    assert err.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    err = error_of(lambda: client.infer("simple", good, outputs=[grpcclient.InferRequestedOutput("NOPE")]))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "unexpected inference output 'NOPE'" in err.message()
    shm_input = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    shm_input.set_shared_memory("not_registered", 16)
    err = error_of(lambda: client.infer("identity_fp32", [shm_input]))
    assert err.status() == "StatusCode.NOT_FOUND"
    assert err.message() == "Unable to find shared memory region: 'not_registered'"


def test_timeout_and_client_deadline(client):
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    assert client.infer("identity_fp32", [tensor], client_timeout=30).as_numpy("OUTPUT0").shape == (1, 4)


async def test_asyncio_client(served):
    async with aioclient.InferenceServerClient(served.grpc_url) as c:
        assert await c.is_server_live()
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        results = await asyncio.gather(*(c.infer("simple", simple_inputs(a, a + i)) for i in range(8)))
        assert [int(r.as_numpy("OUTPUT1")[0, 0]) for r in results] == [-i for i in range(8)]
        with pytest.raises(InferenceServerException) as err:
            await c.infer("nope", simple_inputs(a, a))
        assert err.value.status() == "StatusCode.NOT_FOUND"

        async def requests():
            yield {"model_name": "repeat", "inputs": repeat_input([4, 5]), "request_id": "a"}
            yield {"model_name": "simple", "inputs": simple_inputs(a, a), "request_id": "b"}

        seen = {}
        async for result, error in c.stream_infer(requests()):
            assert error is None
            seen.setdefault(result.get_response().id, []).append(result)
            if len(seen.get("a", [])) == 2 and "b" in seen:
                break
        assert [int(r.as_numpy("OUT")[0]) for r in seen["a"]] == [4, 5]


# -- streaming --------------------------------------------------------------------------------


class Stream:
    """A started stream; its results and errors arrive on a queue."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.results: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)), headers=headers)

    def next(self, timeout: float = 30):
        return self.results.get(timeout=timeout)

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def test_decoupled_stream_many_requests_and_empty_final(served):
    stream = Stream(served.grpc_url)
    try:
        stream.client.async_stream_infer("repeat", repeat_input([1, 2, 3]), request_id="x")
        stream.client.async_stream_infer("repeat", repeat_input([7]), request_id="y", enable_empty_final_response=True)
        got: dict[str, list] = {"x": [], "y": []}
        while len(got["x"]) < 3 or not got["y"] or not got["y"][-1][1]:
            result, error = stream.next()
            assert error is None, error
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            out = result.as_numpy("OUT")
            got[response.id].append((None if out is None else int(out[0]), final))
        assert [v for v, _ in got["x"]] == [1, 2, 3]
        assert got["y"] == [(7, False), (None, True)]  # the final flag alone, as asked
    finally:
        stream.close()


def test_stream_errors_go_on(served):
    stream = Stream(served.grpc_url)
    try:
        stream.client.async_stream_infer("nope", repeat_input([1]), request_id="bad")
        result, error = stream.next()
        assert result is None and error.message() == "Request for unknown model: 'nope' is not found"
        stream.client.async_stream_infer("repeat", repeat_input([1, 2]), request_id="fails", parameters={"fail_at": 1})
        result, error = stream.next()
        assert error is None and int(result.as_numpy("OUT")[0]) == 1
        result, error = stream.next()
        assert result is None and error.message() == "failed at 1"
        a = np.ones((1, 16), np.int32)
        stream.client.async_stream_infer("simple", simple_inputs(a, a), request_id="ok")
        result, error = stream.next()
        assert error is None and result.get_response().parameters["triton_final_response"].bool_param
    finally:
        stream.close()


def test_sequence_over_a_stream(served):
    stream = Stream(served.grpc_url)
    try:
        for i, value in enumerate([1.0, 2.0, 3.0, 4.0]):
            tensor = grpcclient.InferInput("INPUT", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[value]], np.float32))
            stream.client.async_stream_infer(
                "onnx_acc", [tensor], request_id=str(i), sequence_id=42, sequence_start=i == 0, sequence_end=i == 3
            )
        sums = {}
        while len(sums) < 4:
            result, error = stream.next()
            assert error is None, error
            sums[result.get_response().id] = float(result.as_numpy("OUTPUT")[0, 0])
        assert [sums[str(i)] for i in range(4)] == [1.0, 3.0, 6.0, 10.0]
    finally:
        stream.close()


def test_a_cancelled_stream_takes_its_requests_out(served):
    stream = Stream(served.grpc_url)
    name = f"gone-{uuid.uuid4().hex[:6]}"
    stream.client.async_stream_infer(
        "repeat", repeat_input(list(range(200))), request_id=name, parameters={"delay": 0.05}
    )
    result, error = stream.next()
    assert error is None  # the model is answering
    stream.close(cancel=True)
    marker = served.root / "repeat" / "1" / f"cancelled-{name}"
    wait_until(marker.exists, 15, "the model seeing is_cancelled()", 0.05)


def pending(served, model: str) -> float:
    import urllib.request

    with urllib.request.urlopen(served.metrics_url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("nv_inference_pending_request_count") and f'model="{model}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_cancelled_call_leaves_the_queue(client, served):
    """A unary call the client cancels while it waits in the model's batch queue never runs."""
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    before = client.get_inference_statistics("batch_probe", as_json=True)["model_stats"][0]
    done: queue.Queue = queue.Queue()
    call = client.async_infer("batch_probe", [tensor], callback=lambda result, error: done.put((result, error)))
    # waiting for its batch (2 s queue delay)...
    wait_until(lambda: pending(served, "batch_probe") >= 1, 10, "the request in the queue", 0.02)
    call.cancel()  # ...when the client gives up
    result, error = done.get(timeout=10)
    assert result is None and "CANCELLED" in error.status()
    wait_until(lambda: pending(served, "batch_probe") == 0, 5, "the cancelled request leaving the queue", 0.02)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # nothing of it runs, now or when the queue delay ends
        stats = client.get_inference_statistics("batch_probe", as_json=True)["model_stats"][0]
        assert int(stats.get("execution_count", 0)) == int(before.get("execution_count", 0))
        time.sleep(0.5)


# -- shared memory, repository, trace and log settings ------------------------------------------


def test_system_shared_memory(client):
    key = f"/grpc_{uuid.uuid4().hex[:8]}"
    inputs_handle = shm.create_shared_memory_region("in" + key[1:], key + "_in", 128)
    outputs_handle = shm.create_shared_memory_region("out" + key[1:], key + "_out", 128)
    try:
        a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 2, np.int32)
        shm.set_shared_memory_region(inputs_handle, [a, b])
        client.register_system_shared_memory("in", key + "_in", 128)
        client.register_system_shared_memory("out", key + "_out", 128)
        status = client.get_system_shared_memory_status(as_json=True)["regions"]
        assert status["in"]["key"] == key + "_in" and int(status["in"]["byte_size"]) == 128
        err = error_of(lambda: client.register_system_shared_memory("in", key + "_in", 128))
        assert err.status() == "StatusCode.ALREADY_EXISTS"
        assert err.message() == "shared memory region 'in' already in manager"
        inputs = simple_inputs(a, b)
        inputs[0].set_shared_memory("in", 64)
        inputs[1].set_shared_memory("in", 64, offset=64)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("out", 64)
        outputs[1].set_shared_memory("out", 64, offset=64)
        result = client.infer("simple", inputs, outputs=outputs)
        assert list(result.get_output("OUTPUT0").shape) == [1, 16]
        assert np.array_equal(shm.get_contents_as_numpy(outputs_handle, np.int32, [1, 16]), a + b)
        assert np.array_equal(shm.get_contents_as_numpy(outputs_handle, np.int32, [1, 16], offset=64), a - b)
        err = error_of(lambda: client.get_system_shared_memory_status("nope"))
        assert err.status() == "StatusCode.NOT_FOUND"
        assert err.message() == "Unable to find system shared memory region: 'nope'"
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(inputs_handle)
        shm.destroy_shared_memory_region(outputs_handle)
    assert client.get_system_shared_memory_status(as_json=True) == {}
    assert client.get_cuda_shared_memory_status(as_json=True) == {}


def test_model_control(client, served):
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    assert index["simple"]["state"] == "READY"
    client.unload_model("nobatch")
    assert not client.is_model_ready("nobatch")
    client.load_model("nobatch")
    assert client.is_model_ready("nobatch")
    config = client.get_model_config("identity_int32", as_json=True)["config"]
    config["max_batch_size"] = 4
    onnx = (served.root / "identity_int32" / "1" / "model.onnx").read_bytes()
    client.load_model(
        "from_files", config=json.dumps({**config, "name": "from_files"}), files={"file:1/model.onnx": onnx}
    )
    assert client.get_model_config("from_files", as_json=True)["config"]["max_batch_size"] == 4
    client.unload_model("from_files")
    err = error_of(lambda: client.load_model("not_there"))
    assert err.status() == "StatusCode.INTERNAL"
    assert "failed to load 'not_there', failed to poll from model repository" in err.message()
    err = error_of(lambda: client.load_model("simple", config="{not json"))
    assert err.status() == "StatusCode.INTERNAL"
    assert err.message() == "failed to load 'simple', failed to poll from model repository"


def test_trace_and_log_settings(client):
    settings = client.get_trace_settings(as_json=True)["settings"]
    assert settings["trace_level"]["value"] == ["OFF"] and settings["trace_mode"]["value"] == ["triton"]
    updated = client.update_trace_settings("simple", {"trace_rate": "7"}, as_json=True)["settings"]
    assert updated["trace_rate"]["value"] == ["7"]
    cleared = client.update_trace_settings("simple", {"trace_rate": None}, as_json=True)["settings"]
    assert cleared["trace_rate"]["value"] == ["1000"]
    err = error_of(lambda: client.get_trace_settings("nope"))
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and err.message() == "Request for unknown model : nope"
    err = error_of(lambda: client.update_trace_settings(settings={"trace_level": ["BOGUS"]}))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    logs = client.get_log_settings(as_json=True)["settings"]
    assert logs["log_info"]["bool_param"] is True
    logs = client.update_log_settings({"log_verbose_level": 1}, as_json=True)["settings"]
    assert logs["log_verbose_level"]["uint32_param"] == 1
    client.update_log_settings({"log_verbose_level": 0})
    err = error_of(lambda: client.update_log_settings({"log_file": "/tmp/x"}))
    assert err.status() == "StatusCode.UNIMPLEMENTED"


# -- both servers: the flags that shape the transport (Shoal's own, and grpcio's behind --grpc-server) --


@pytest.fixture(scope="module", params=["shoal", "grpcio"])
def flagged(request, tmp_path_factory):
    root = build_test_repository(tmp_path_factory.mktemp(f"grpc_flags_{request.param}"))
    with running_cluster(
        root,
        grpc_server=request.param,
        grpc_restricted_protocol=["health,inference:x-shoal-key=secret"],
        grpc_infer_response_compression_level="high",
    ) as running:
        yield running


def test_restricted_protocol_and_compressed_answers(flagged):
    header = {"x-shoal-key": "secret"}
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    with grpcclient.InferenceServerClient(flagged.grpc_url) as c:
        for call in (c.is_server_live, lambda: c.infer("simple", simple_inputs(a, a))):
            err = error_of(call)
            assert err.status() == "StatusCode.UNAVAILABLE"
            assert err.message() == "This protocol is restricted, expecting header 'x-shoal-key'"
        assert c.is_server_live(headers=header)
        assert c.get_server_metadata().name == "triton"  # metadata is not restricted
        result = c.infer("simple", simple_inputs(a, a), headers=header, compression_algorithm="gzip")
        assert np.array_equal(result.as_numpy("OUTPUT0"), a + a)
        stream = Stream(flagged.grpc_url, headers=header)
        try:
            stream.client.async_stream_infer("simple", simple_inputs(a, a))
            result, error = stream.next()
            assert error is None and np.array_equal(result.as_numpy("OUTPUT1"), a - a)
        finally:
            stream.close()
