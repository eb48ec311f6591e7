"""The DALI backend as Triton's examples use it: an ensemble whose first step is a serialized DALI
pipeline decoding and resizing an image and whose second is an ONNX classifier, served and
answered through tritonclient (HTTP and gRPC). The pipeline runs on the CPU (a KIND_CPU
instance: DALI's CPU operators need no GPU); the same pipeline with a mixed decoder runs on a
KIND_GPU instance where a GPU is lent, and is skipped elsewhere with the reason."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

from services.worker.gpus import available_gpus
from tests.cluster import Running, running_cluster

dali = pytest.importorskip("nvidia.dali", reason="the DALI tests need the dali extra: pip install 'shoal[dali]'")
fn = pytest.importorskip("nvidia.dali.fn")
types = pytest.importorskip("nvidia.dali.types")

SIDE = 32
CLASSES = 10


def png(pixels: np.ndarray) -> bytes:
    """An RGB image as PNG bytes (zlib and struct: no imaging library needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    height, width, _ = pixels.shape
    rows = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def serialize_pipeline(path: Path, decoder_device: str, device_id: int | None) -> None:
    @dali.pipeline_def(batch_size=8, num_threads=1, device_id=device_id)
    def preprocess():
        encoded = fn.external_source(device="cpu", name="DALI_INPUT_0", dtype=types.UINT8, ndim=1)
        images = fn.decoders.image(encoded, device=decoder_device, output_type=types.RGB)
        images = fn.resize(images, resize_x=SIDE, resize_y=SIDE)
        return fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW", mean=[0.485 * 255, 0.456 * 255, 0.406 * 255], std=[58.4] * 3
        )

    preprocess().serialize(filename=str(path))


def classifier(path: Path) -> None:
    weights = np.random.default_rng(1).standard_normal((3 * SIDE * SIDE, CLASSES)).astype(np.float32) * 0.01
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["INPUT"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "W"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["PROBABILITIES"], axis=1),
        ],
        "classifier",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, [None, 3, SIDE, SIDE])],
        [helper.make_tensor_value_info("PROBABILITIES", TensorProto.FLOAT, [None, CLASSES])],
        [numpy_helper.from_array(weights, "W")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))


DALI_CONFIG = """
name: "{name}"
backend: "dali"
max_batch_size: 8
input [ {{ name: "DALI_INPUT_0" data_type: TYPE_UINT8 dims: [ -1 ] }} ]
output [ {{ name: "DALI_OUTPUT_0" data_type: TYPE_FP32 dims: [ 3, {side}, {side} ] }} ]
instance_group [ {{ kind: {kind} }} ]
parameters [ {{ key: "num_threads" value: {{ string_value: "1" }} }} ]
"""

CLASSIFIER_CONFIG = f"""
name: "classifier"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 3, {SIDE}, {SIDE} ] }} ]
output [ {{ name: "PROBABILITIES" data_type: TYPE_FP32 dims: [ {CLASSES} ] }} ]
"""

ENSEMBLE_CONFIG = f"""
name: "{{name}}"
platform: "ensemble"
max_batch_size: 8
input [ {{{{ name: "IMAGE" data_type: TYPE_UINT8 dims: [ -1 ] }}}} ]
output [ {{{{ name: "PROBABILITIES" data_type: TYPE_FP32 dims: [ {CLASSES} ] }}}} ]
ensemble_scheduling {{{{ step [
  {{{{ model_name: "{{dali}}" model_version: -1 input_map {{{{ key: "DALI_INPUT_0" value: "IMAGE" }}}}
     output_map {{{{ key: "DALI_OUTPUT_0" value: "preprocessed" }}}} }}}},
  {{{{ model_name: "classifier" model_version: -1 input_map {{{{ key: "INPUT" value: "preprocessed" }}}}
     output_map {{{{ key: "PROBABILITIES" value: "PROBABILITIES" }}}} }}}}
] }}}}
"""


def write(root: Path, name: str, config: str) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    return root / name / "1"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dali")
    serialize_pipeline(
        # no backend line: model.dali says it (issue 48)
        write(
            root,
            "dali_cpu",
            DALI_CONFIG.format(name="dali_cpu", side=SIDE, kind="KIND_CPU").replace('backend: "dali"\n', ""),
        )
        / "model.dali",
        "cpu",
        None,
    )
    classifier(write(root, "classifier", CLASSIFIER_CONFIG) / "model.onnx")
    write(root, "ensemble_cpu", ENSEMBLE_CONFIG.format(name="ensemble_cpu", dali="dali_cpu"))
    if available_gpus():  # the same pipeline with nvJPEG's mixed decoder on the GPU
        version = write(root, "dali_gpu", DALI_CONFIG.format(name="dali_gpu", side=SIDE, kind="KIND_GPU"))
        serialize_pipeline(version / "model.dali", "mixed", 0)
        write(root, "ensemble_gpu", ENSEMBLE_CONFIG.format(name="ensemble_gpu", dali="dali_gpu"))
    return root


@pytest.fixture(scope="module")
def served(repository: Path) -> Running:
    with running_cluster(repository) as running:
        yield running


def images() -> list[bytes]:
    rng = np.random.default_rng(4)
    return [png((rng.random((20 + 7 * i, 30 + 5 * i, 3)) * 255).astype(np.uint8)) for i in range(3)]


def expected(repository: Path, encoded: list[bytes]) -> np.ndarray:
    """The same pipeline and classifier in-process: DALI on the CPU, then onnxruntime."""
    pipeline = dali.Pipeline.deserialize(
        filename=str(repository / "dali_cpu" / "1" / "model.dali"), batch_size=8, num_threads=1, device_id=None
    )
    pipeline.build()
    pipeline.feed_input("DALI_INPUT_0", [np.frombuffer(e, np.uint8) for e in encoded])
    (batch,) = pipeline.run()
    session = ort.InferenceSession(str(repository / "classifier" / "1" / "model.onnx"))
    return session.run(None, {"INPUT": np.array(batch.as_tensor())})[0]


def padded(encoded: list[bytes]) -> np.ndarray:
    """Triton takes one shape per batch: the images' bytes zero-padded to the longest (as its DALI examples do)."""
    width = max(len(e) for e in encoded)
    return np.stack([np.pad(np.frombuffer(e, np.uint8), (0, width - len(e))) for e in encoded])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_dali_then_onnx_ensemble_answers_as_in_process(served, repository, protocol):
    encoded = images()
    batch = padded(encoded)
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(served.url if protocol == "http" else served.grpc_url)
    tensor = module.InferInput("IMAGE", list(batch.shape), "UINT8")
    tensor.set_data_from_numpy(batch)
    got = client.infer("ensemble_cpu", [tensor]).as_numpy("PROBABILITIES")
    np.testing.assert_allclose(got, expected(repository, [bytes(row) for row in batch]), rtol=0, atol=1e-6)
    assert got.shape == (3, CLASSES)


@pytest.mark.skipif(
    not available_gpus(), reason="needs a CUDA device (this host has none): the GPU pipeline runs on KIND_GPU only"
)
def test_dali_gpu_pipeline_in_the_ensemble(served, repository):
    batch = padded(images())
    client = httpclient.InferenceServerClient(served.url)
    tensor = httpclient.InferInput("IMAGE", list(batch.shape), "UINT8")
    tensor.set_data_from_numpy(batch)
    got = client.infer("ensemble_gpu", [tensor]).as_numpy("PROBABILITIES")
    cpu = client.infer("ensemble_cpu", [tensor]).as_numpy("PROBABILITIES")
    np.testing.assert_allclose(got, cpu, atol=1e-2)  # nvJPEG and the CPU decoder may round differently


def test_perf_analyzer_on_the_dali_ensemble(perf_analyzer, served, tmp_path):
    import json

    from tests.integration.test_perf_analyzer import run as perf_run

    image = np.frombuffer(images()[0], np.uint8)
    data = tmp_path / "image.json"
    data.write_text(json.dumps({"data": [{"IMAGE": {"content": image.tolist(), "shape": [len(image)]}}]}))
    perf_run(perf_analyzer, served.url, "-m", "ensemble_cpu", "--input-data", str(data), "--concurrency-range", "2")
