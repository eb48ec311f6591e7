"""Overload (issue 47, item 3; docs/reliability.md, "Overload"): a request beyond a model's queue
limit (`dynamic_batching { default_queue_policy { max_queue_size } }`) is refused at once with
Triton's status and text (`Exceeds maximum queue size`: HTTP 503, gRPC UNAVAILABLE; Triton's
`PolicyQueue::Enqueue`), the requests admitted before it are served, and the model serves as
before once the load is gone. Not a timing test: the model's `execute` waits for a file, so the
queue is full for as long as the test wants; the timings are benchmarks/overload.py's."""

from __future__ import annotations

import textwrap
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc as grpc_module
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.serving import Serve, wait_until

MAX_QUEUE = 2
START_S = 180.0

MODEL_PY = """
import os
import time

import triton_python_backend_utils as pb_utils

GATE = {gate!r}


class TritonPythonModel:
    def execute(self, requests):
        open(GATE + ".waiting", "w").close()  # the test sees a batch running
        deadline = time.monotonic() + 120
        while not os.path.exists(GATE) and time.monotonic() < deadline:
            time.sleep(0.02)
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""

CONFIG = f"""
name: "gated"
backend: "python"
max_batch_size: 1
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ default_queue_policy {{ max_queue_size: {MAX_QUEUE} }} }}
"""


def http_infer(url: str, value: float) -> np.ndarray:
    client = httpclient.InferenceServerClient(url, network_timeout=180)
    try:
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.full((1, 4), value, np.float32))
        out = client.infer("gated", [tensor]).as_numpy("OUTPUT0")
        assert out is not None
        return out
    finally:
        client.close()


def grpc_infer(url: str, value: float) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.full((1, 4), value, np.float32))
        out = client.infer("gated", [tensor], client_timeout=180).as_numpy("OUTPUT0")
        assert out is not None
        return out
    finally:
        client.close()


def refused(future: Future) -> bool:
    return future.done() and future.exception() is not None


@pytest.mark.timeout(600)
def test_beyond_the_queue_limit_refused_with_tritons_status_then_served_again(tmp_path: Path):
    gate = tmp_path / "gate"
    running = tmp_path / "gate.waiting"
    repo = tmp_path / "models"
    (repo / "gated" / "1").mkdir(parents=True)
    (repo / "gated" / "1" / "model.py").write_text(textwrap.dedent(MODEL_PY.format(gate=str(gate))))
    (repo / "gated" / "config.pbtxt").write_text(CONFIG)
    serve = Serve(tmp_path / "serve", [f"--model-repository={repo}"]).start(START_S)
    grpc_url = f"127.0.0.1:{serve.grpc_port}"
    pool = ThreadPoolExecutor(16)
    try:
        first = pool.submit(http_infer, serve.url, 0.0)
        wait_until(lambda: running.exists(), START_S, "the first batch running")  # the instance is busy
        more = [pool.submit(http_infer, serve.url, float(i)) for i in range(1, 10)]
        # MAX_QUEUE of them wait in the queue; the others are refused at once
        wait_until(lambda: sum(map(refused, more)) == len(more) - MAX_QUEUE, START_S, "the refusals", 0.05)
        errors = [f.exception() for f in more if refused(f)]
        for error in errors:
            assert isinstance(error, InferenceServerException)
            assert error.status() == "503", error
            assert "Exceeds maximum queue size" in error.message(), error
        with pytest.raises(InferenceServerException) as over_grpc:
            grpc_infer(grpc_url, 99.0)
        assert over_grpc.value.status() == str(grpc_module.StatusCode.UNAVAILABLE), over_grpc.value
        assert "Exceeds maximum queue size" in over_grpc.value.message()
        assert not first.done()

        gate.touch()  # the load is gone: what was admitted is served, in full
        assert np.array_equal(first.result(120), np.zeros((1, 4), np.float32))
        admitted = [(i, f) for i, f in enumerate(more, 1) if not refused(f)]
        assert len(admitted) == MAX_QUEUE
        for i, future in admitted:
            assert np.array_equal(future.result(120), np.full((1, 4), float(i), np.float32))
        # and the model serves as before, over both protocols
        assert np.array_equal(http_infer(serve.url, 5.0), np.full((1, 4), 5.0, np.float32))
        assert np.array_equal(grpc_infer(grpc_url, 6.0), np.full((1, 4), 6.0, np.float32))
        serve.terminate(60)
    finally:
        gate.touch()
        pool.shutdown(wait=False, cancel_futures=True)
        if serve.process is not None and serve.process.poll() is None:
            serve.kill_tree()
