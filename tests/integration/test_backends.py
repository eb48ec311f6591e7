"""Backends and instance groups through the real system: TorchScript models (Triton's INPUT__0
and forward-argument conventions), an ONNX model with two instance groups, a TensorRT plan
that cannot load here beside models that do, optional inputs and BYTES through every backend
that takes them. GPU paths run where a CUDA device exists and are skipped with the reason
elsewhere."""

from __future__ import annotations

import asyncio
import textwrap
import warnings
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto

from services.repository import examples
from services.worker.gpus import available_gpus
from shoal.topology import collect
from tests.cluster import Running, identity_config, running_cluster

try:  # torch is optional (the `torch` extra): without it the TorchScript models must fail clearly
    import torch
except ImportError:
    torch = None
NO_GPU = "needs a CUDA device (this host has none): KIND_GPU instances cannot load here"
needs_torch = pytest.mark.skipif(
    torch is None, reason="the TorchScript backend needs torch: pip install 'shoal[torch]'"
)
TORCH_MODELS = ("torch_indexed", "torch_named", "torch_strings")

if torch is not None:

    class AddSub(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor):
            return a + b, a - b

    class Scaled(torch.nn.Module):
        """Named inputs in forward()'s order; `scale` may be left out; outputs by name."""

        def forward(self, x: torch.Tensor, scale: Optional[torch.Tensor] = None):
            factor = scale if scale is not None else torch.full_like(x, 10.0)
            return {"y": x * factor, "count": torch.tensor([x.numel()], dtype=torch.int64)}

    class Upper(torch.nn.Module):
        def forward(self, words: list[str]) -> list[str]:
            return [w.upper() for w in words]


TORCH_INDEXED = """
name: "torch_indexed"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } },
        { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } },
         { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

TORCH_NAMED = """
name: "torch_named"
backend: "pytorch"
max_batch_size: 0
input [ { name: "scale" data_type: TYPE_FP32 dims: [ -1 ] optional: true },
        { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "count" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""

TORCH_STRINGS = """
name: "torch_strings"
backend: "pytorch"
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_STRING dims: [ 2 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ 2 ] } ]
"""

GROUPS = identity_config("onnx_groups", "FP32").replace(
    "instance_group [ { count: 1 kind: KIND_CPU } ]",
    'instance_group [ { name: "first" count: 1 kind: KIND_CPU }, { count: 2 kind: KIND_CPU } ]',
)

GPU_ONNX = identity_config("onnx_gpu", "FP32").replace("kind: KIND_CPU", "kind: KIND_GPU")  # every GPU of the worker

TENSORRT = """
name: "trt_plan"
platform: "tensorrt_plan"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

PY_OPTIONAL = """
name: "py_optional"
backend: "python"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 2 ] optional: true },
        { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] optional: true } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "ECHO" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

PY_OPTIONAL_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B")  # None when the client left it out
            text = pb_utils.get_input_tensor_by_name(request, "TEXT")
            echo = text.as_numpy() if text is not None else np.array([[b"none"]] * len(a), dtype=object)
            total = a + (b.as_numpy() if b is not None else 100)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", total.astype(np.float32)), pb_utils.Tensor("ECHO", echo)]))
        return responses
"""


def _torch_model(root: Path, name: str, module_class: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    if torch is None:
        (root / name / "1" / "model.pt").write_bytes(b"a TorchScript archive needs torch to be written")
    else:
        with warnings.catch_warnings():  # Triton's pytorch backend loads TorchScript, which torch 2.13 deprecates
            warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", DeprecationWarning)
            torch.jit.script(globals()[module_class]()).save(str(root / name / "1" / "model.pt"))
    (root / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def backends_cluster(tmp_path_factory: pytest.TempPathFactory) -> Running:
    root = tmp_path_factory.mktemp("backend_models")
    _torch_model(root, "torch_indexed", "AddSub", TORCH_INDEXED)
    _torch_model(root, "torch_named", "Scaled", TORCH_NAMED)
    _torch_model(root, "torch_strings", "Upper", TORCH_STRINGS)
    examples.write_model(root, "onnx_groups", examples.identity_graph(TensorProto.FLOAT, 2, "onnx_groups"), GROUPS)
    examples.write_model(root, "onnx_gpu", examples.identity_graph(TensorProto.FLOAT, 2, "onnx_gpu"), GPU_ONNX)
    (root / "trt_plan" / "1").mkdir(parents=True)
    (root / "trt_plan" / "1" / "model.plan").write_bytes(b"not a serialized engine")
    (root / "trt_plan" / "config.pbtxt").write_text(TENSORRT)
    (root / "py_optional" / "1").mkdir(parents=True)
    (root / "py_optional" / "1" / "model.py").write_text(textwrap.dedent(PY_OPTIONAL_MODEL))
    (root / "py_optional" / "config.pbtxt").write_text(PY_OPTIONAL)
    with running_cluster(root) as running:
        yield running


@pytest.fixture
def client(backends_cluster: Running) -> httpclient.InferenceServerClient:
    c = httpclient.InferenceServerClient(backends_cluster.url, network_timeout=60)
    yield c
    c.close()


def tensor(name: str, value: np.ndarray, datatype: str) -> httpclient.InferInput:
    t = httpclient.InferInput(name, list(value.shape), datatype)
    t.set_data_from_numpy(value)
    return t


@needs_torch
def test_torchscript_input_index_convention_with_reshape(client):
    assert client.get_model_metadata("torch_indexed")["platform"] == "pytorch_libtorch"
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.full((3, 4), 2.0, np.float32)
    result = client.infer("torch_indexed", [tensor("INPUT__0", a, "FP32"), tensor("INPUT__1", b, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)  # back in `dims` [4], not [2, 2]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)
    only = client.infer(
        "torch_indexed",
        [tensor("INPUT__0", a, "FP32"), tensor("INPUT__1", b, "FP32")],
        outputs=[httpclient.InferRequestedOutput("OUTPUT__1")],
    )
    np.testing.assert_array_equal(only.as_numpy("OUTPUT__1"), a - b)
    assert only.as_numpy("OUTPUT__0") is None


@needs_torch
def test_torchscript_named_inputs_and_optional_input(client):
    x = np.array([1.0, 2.0, 3.0], np.float32)
    scale = np.array([2.0, 3.0, 4.0], np.float32)
    # config order (scale, x) differs from forward(x, scale): names bind by keyword
    result = client.infer("torch_named", [tensor("x", x, "FP32"), tensor("scale", scale, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("y"), x * scale)
    np.testing.assert_array_equal(result.as_numpy("count"), [3])
    without = client.infer("torch_named", [tensor("x", x, "FP32")])  # `scale` omitted: forward()'s default
    np.testing.assert_array_equal(without.as_numpy("y"), x * 10)


@needs_torch
def test_torchscript_bytes_as_list_of_str(client):
    words = np.array([[b"ab", b"cd"], [b"ef", b"gh"]], dtype=object)
    result = client.infer("torch_strings", [tensor("INPUT__0", words, "BYTES")])
    assert result.as_numpy("OUTPUT__0").tolist() == [[b"AB", b"CD"], [b"EF", b"GH"]]


def _instances(running: Running, model: str) -> list[dict]:
    workers = [s for s in asyncio.run(collect(running.nats.url)) if s["name"] == "shoal-worker"]
    return [i for w in workers for i in w["status"]["models"].get(f"{model}/1", {}).get("instance_list", [])]


def test_two_instance_groups_both_serve(client, backends_cluster):
    instances = _instances(backends_cluster, "onnx_groups")
    assert [(i["name"], i["kind"]) for i in instances] == [
        ("first", "KIND_CPU"),
        ("onnx_groups_1_0", "KIND_CPU"),
        ("onnx_groups_1_1", "KIND_CPU"),
    ]
    config = client.get_model_config("onnx_groups")
    assert [(g["name"], g["count"]) for g in config["instance_group"]] == [("first", 1), ("onnx_groups_1", 2)]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for _ in range(20):  # the worker announces one credit of every instance before any second one
        pending = [client.async_infer("onnx_groups", [tensor("INPUT0", x, "FP32")]) for _ in range(6)]
        for request in pending:
            np.testing.assert_array_equal(request.get_result().as_numpy("OUTPUT0"), x)
        executions = {i["name"]: i["executions"] for i in _instances(backends_cluster, "onnx_groups")}
        if executions["first"] and (executions["onnx_groups_1_0"] or executions["onnx_groups_1_1"]):
            break
    assert executions["first"] > 0 and executions["onnx_groups_1_0"] + executions["onnx_groups_1_1"] > 0, executions


def test_tensorrt_plan_fails_with_reason_and_the_rest_loads(client):
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert index["trt_plan"]["state"] == "UNAVAILABLE"
    if not available_gpus():
        assert (
            "TensorRT backend needs an NVIDIA GPU and the 'tensorrt' package: pip install 'shoal[gpu]'"
            in index["trt_plan"]["reason"]
        )
    else:  # a GPU and maybe tensorrt here: the bytes are still not an engine
        assert index["trt_plan"]["reason"]
    good_models = ["onnx_groups", "py_optional"] + (list(TORCH_MODELS) if torch is not None else [])
    for good in good_models:
        assert index[good]["state"] == "READY", index[good]
        assert client.is_model_ready(good)
    assert not client.is_model_ready("trt_plan")


def test_without_torch_torchscript_models_fail_clearly(client):
    if torch is not None:
        pytest.skip("torch is installed: the TorchScript models load (the tests above)")
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    for name in TORCH_MODELS:
        assert index[name]["state"] == "UNAVAILABLE"
        assert "backend 'pytorch' cannot be imported" in index[name]["reason"]
        assert "pip install 'shoal[torch]'" in index[name]["reason"]
    assert index["onnx_groups"]["state"] == "READY"


def test_optional_and_bytes_inputs_reach_a_python_model(client):
    a = np.ones((2, 2), np.float32)
    b = np.full((2, 2), 5.0, np.float32)
    text = np.array([[b"hi"], [b"there"]], dtype=object)
    full = client.infer("py_optional", [tensor("A", a, "FP32"), tensor("B", b, "FP32"), tensor("TEXT", text, "BYTES")])
    np.testing.assert_array_equal(full.as_numpy("SUM"), a + b)
    assert full.as_numpy("ECHO").tolist() == [[b"hi"], [b"there"]]
    bare = client.infer("py_optional", [tensor("A", a, "FP32")])  # the model gets no B and no TEXT tensor
    np.testing.assert_array_equal(bare.as_numpy("SUM"), a + 100)
    assert bare.as_numpy("ECHO").tolist() == [[b"none"], [b"none"]]


def test_kind_gpu_without_a_gpu_fails_like_triton(client):
    if available_gpus():
        pytest.skip("this host has a GPU: test_kind_gpu_onnx_model_serves covers it")
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert index["onnx_gpu"]["state"] == "UNAVAILABLE"
    assert (
        "instance group onnx_gpu_0 of model onnx_gpu has kind KIND_GPU but no GPUs are available"
        in index["onnx_gpu"]["reason"]
    )


@pytest.mark.gpu
def test_kind_gpu_onnx_model_serves(client, backends_cluster):
    if not available_gpus():
        pytest.skip(NO_GPU)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(client.infer("onnx_gpu", [tensor("INPUT0", x, "FP32")]).as_numpy("OUTPUT0"), x)
    assert [(i["kind"], i["device"]) for i in _instances(backends_cluster, "onnx_gpu")] == [
        ("KIND_GPU", g) for g in available_gpus()
    ]


@pytest.mark.gpu
@needs_torch
def test_kind_gpu_torchscript_model_runs_on_cuda(tmp_path):
    if not available_gpus() or not torch.cuda.is_available():
        pytest.skip(NO_GPU + " (or torch is a CPU build)")
    _torch_model(
        tmp_path,
        "torch_gpu",
        "AddSub",
        TORCH_INDEXED.replace("torch_indexed", "torch_gpu").replace(
            "count: 2 kind: KIND_CPU", "count: 1 kind: KIND_GPU gpus: [ 0 ]"
        ),
    )
    with running_cluster(tmp_path) as running:
        c = httpclient.InferenceServerClient(running.url)
        a = np.arange(8, dtype=np.float32).reshape(2, 4)
        result = c.infer("torch_gpu", [tensor("INPUT__0", a, "FP32"), tensor("INPUT__1", a, "FP32")])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), 2 * a)
        assert [(i["kind"], i["device"]) for i in _instances(running, "torch_gpu")] == [("KIND_GPU", 0)]
        c.close()
