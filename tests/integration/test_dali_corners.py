"""Triton's DALI backend's config auto-complete and `split_along_outer_axis`, through tritonclient:
a model whose config names only the backend and the parameter gets its inputs, outputs, batch
size and dynamic batching from the pipeline; its `FRAMES` output (each sample a clip of frames)
answers one sample per frame, its `SAME` output one per clip. The pipeline runs on the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.cluster import Running, running_cluster

dali = pytest.importorskip("nvidia.dali", reason="the DALI tests need the dali extra: pip install 'shoal[dali]'")
fn = pytest.importorskip("nvidia.dali.fn")
types = pytest.importorskip("nvidia.dali.types")

CONFIG = """backend: "dali"
parameters [ { key: "split_along_outer_axis" value: { string_value: "FRAMES" } },
             { key: "num_threads" value: { string_value: "1" } } ]
"""


def serialize(path: Path) -> None:
    @dali.pipeline_def(
        batch_size=6, num_threads=1, device_id=None, output_dtype=[types.FLOAT, types.UINT8], output_ndim=[3, 3]
    )
    def clips():
        video = fn.external_source(device="cpu", name="VIDEO", dtype=types.UINT8, ndim=3)
        doubled = fn.cast(video, dtype=types.FLOAT) * 2
        return fn.cast(doubled, dtype=types.FLOAT, name="FRAMES"), fn.copy(video, name="SAME")  # the outputs' names

    clips().serialize(filename=str(path))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Running:
    root = tmp_path_factory.mktemp("dali_corners")
    (root / "clips" / "1").mkdir(parents=True)
    (root / "clips" / "config.pbtxt").write_text(CONFIG)
    serialize(root / "clips" / "1" / "model.dali")
    with running_cluster(root) as running:
        yield running


def test_the_config_is_completed_from_the_pipeline(served):
    config = httpclient.InferenceServerClient(served.url).get_model_config("clips")
    assert config["max_batch_size"] == 6 and "dynamic_batching" in config
    assert [(i["name"], i["data_type"], i["dims"], i.get("allow_ragged_batch")) for i in config["input"]] == [
        ("VIDEO", "TYPE_UINT8", [-1, -1, -1], True)
    ]
    # FRAMES is split: its outer dimension is not in its dims
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("FRAMES", "TYPE_FP32", [-1, -1]),
        ("SAME", "TYPE_UINT8", [-1, -1, -1]),
    ]


def clips(count: int, frames: int, side: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (count, frames, side, side), dtype=np.uint8)


def test_split_along_outer_axis_answers_a_sample_per_frame(served):
    http = httpclient.InferenceServerClient(served.url, concurrency=4)

    def one(video: np.ndarray) -> httpclient.InferAsyncRequest:
        tensor = httpclient.InferInput("VIDEO", list(video.shape), "UINT8")
        tensor.set_data_from_numpy(video)
        return http.async_infer("clips", [tensor])

    # requests of different shapes, batched together where the batcher may (a ragged input)
    videos = [clips(2, 3, 4, 1), clips(1, 5, 2, 2), clips(3, 2, 4, 3)]
    for video, result in zip(videos, [request.get_result() for request in [one(v) for v in videos]]):
        frames = result.as_numpy("FRAMES")
        assert frames.shape == (video.shape[0] * video.shape[1], *video.shape[2:])
        np.testing.assert_array_equal(frames, video.reshape(-1, *video.shape[2:]).astype(np.float32) * 2)
        np.testing.assert_array_equal(result.as_numpy("SAME"), video)
    grpc = grpcclient.InferenceServerClient(served.grpc_url)
    video = clips(2, 4, 3, 4)
    tensor = grpcclient.InferInput("VIDEO", list(video.shape), "UINT8")
    tensor.set_data_from_numpy(video)
    frames = grpc.infer("clips", [tensor], outputs=[grpcclient.InferRequestedOutput("FRAMES")]).as_numpy("FRAMES")
    assert frames.shape == (8, 3, 3)
