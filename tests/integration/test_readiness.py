"""Ready means ready (issue 47, item 0; docs/reliability.md, "Ready means ready"): `shoal serve`
is not ready before every model it loads at start is READY or has failed, whatever the order in
which the repository publishes them and the workers load them. A slow repository and a slow
worker are made slow on purpose (tests/integration/gated_models.py), so the states checked here
hold for as long as the test wants, not by luck of timing; HTTP and gRPC answer alike."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.gated_models import write_onnx, write_python
from tests.serving import Serve, listening, wait_until

START_S = 180.0  # services starting on a loaded machine


def readiness(serve: Serve) -> tuple[bool, bool]:
    """(HTTP's answer, gRPC's) to "is the server ready"."""
    http = httpclient.InferenceServerClient(serve.url, network_timeout=30)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{serve.grpc_port}")
    try:
        return http.is_server_ready(), grpc.is_server_ready()
    finally:
        http.close()
        grpc.close()


def model_readiness(serve: Serve, name: str) -> tuple[bool, bool]:
    http = httpclient.InferenceServerClient(serve.url, network_timeout=30)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{serve.grpc_port}")
    try:
        return http.is_model_ready(name), grpc.is_model_ready(name)
    finally:
        http.close()
        grpc.close()


def infer(serve: Serve, name: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(serve.url, network_timeout=60)
    try:
        value = np.arange(4, dtype=np.float32)
        tensor = httpclient.InferInput("INPUT0", [4], "FP32")
        tensor.set_data_from_numpy(value)
        out = client.infer(name, [tensor]).as_numpy("OUTPUT0")
        assert out is not None
        return out
    finally:
        client.close()


def answering(serve: Serve) -> bool:
    assert serve.process is not None and serve.process.poll() is None, serve.log()[-4000:]
    return listening(serve.http_port) and listening(serve.grpc_port)


def index(serve: Serve) -> dict[str, str]:
    """The repository's index (answered once its start-up models are published): name -> state."""
    client = httpclient.InferenceServerClient(serve.url, network_timeout=30)
    try:
        return {e["name"]: e.get("state", "") for e in client.get_model_repository_index()}
    finally:
        client.close()


def waiting(gate: Path) -> bool:
    return gate.with_name(gate.name + ".waiting").exists()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "not-strict"])
def test_not_ready_before_the_start_up_models_are_published_and_loaded(tmp_path, strict):
    """The repository reads `a_repository_slow` first and waits in its `auto_complete_config`: it
    has published no model yet, and the gateway, whose view of the models bucket is empty (every
    model it knows is READY), is not ready. Once the repository publishes every model,
    `b_worker_slow` is LOADING (its `initialize` waits): still not ready. Once it loads, the server
    is ready, over HTTP and gRPC alike, and every model serves at once."""
    repo = tmp_path / "models"
    repository_gate, worker_gate = tmp_path / "repository-gate", tmp_path / "worker-gate"
    write_python(repo, "a_repository_slow", repository_gate=repository_gate)
    write_python(repo, "b_worker_slow", worker_gate=worker_gate)
    write_onnx(repo, "c_fast")
    serve = Serve(tmp_path / "serve", [f"--model-repository={repo}", f"--strict-readiness={str(strict).lower()}"])
    serve.start(wait=False)
    try:
        wait_until(lambda: answering(serve) and waiting(repository_gate), START_S, "the repository reading a", 0.2)
        # the gateway is up and watching (its stats answer once a scheduler is on the bus)
        wait_until(lambda: statistics_answer(serve), START_S, "the gateway's statistics", 0.2)
        assert readiness(serve) == (False, False)
        assert model_readiness(serve, "c_fast") == (False, False)

        repository_gate.touch()
        # the index answers once every start-up record is published; b waits in its initialize
        wait_until(
            lambda: index(serve).get("b_worker_slow") == "LOADING",
            START_S,
            "b LOADING",
            0.2,
            errors=(InferenceServerException,),  # 503 until the repository has published them
        )
        wait_until(lambda: waiting(worker_gate), START_S, "b's initialize waiting", 0.1)
        assert readiness(serve) == (False, False)
        assert model_readiness(serve, "b_worker_slow") == (False, False)

        worker_gate.touch()
        wait_until(lambda: readiness(serve) == (True, True), START_S, "the server ready", 0.2)
        for name in ("a_repository_slow", "b_worker_slow", "c_fast"):
            assert model_readiness(serve, name) == (True, True), name
            assert np.array_equal(infer(serve, name), np.arange(4, dtype=np.float32)), name
        serve.terminate(60)
    finally:
        repository_gate.touch()
        worker_gate.touch()
        if serve.process is not None and serve.process.poll() is None:
            serve.kill_tree()


def statistics_answer(serve: Serve) -> bool:
    client = httpclient.InferenceServerClient(serve.url, network_timeout=30)
    try:
        client.get_inference_statistics()
        return True
    except Exception:
        return False
    finally:
        client.close()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "not-strict"])
def test_a_model_that_fails_at_start_ends_the_wait(tmp_path, strict):
    """A start-up model that fails to load has been tried: without strict readiness the server is
    ready once the others are READY; with it (the default) it is not, as tritonserver."""
    repo = tmp_path / "models"
    write_onnx(repo, "a_fast")
    write_python(repo, "b_broken")
    (repo / "b_broken" / "1" / "model.py").write_text("raise RuntimeError('broken on purpose')\n")
    serve = Serve(tmp_path / "serve", [f"--model-repository={repo}", f"--strict-readiness={str(strict).lower()}"])
    serve.start(wait=False)
    try:
        wait_until(lambda: answering(serve), START_S, "shoal serve's HTTP and gRPC ports")
        wait_until(lambda: model_readiness(serve, "a_fast") == (True, True), START_S, "a_fast READY", 0.2)
        if strict:  # the table is printed once b_broken has failed: then strict readiness stays false
            wait_until(lambda: "| Model" in serve.log(), START_S, "shoal serve's model table")
            assert readiness(serve) == (False, False)
        else:
            wait_until(lambda: readiness(serve) == (True, True), START_S, "the server ready", 0.2)
        assert model_readiness(serve, "b_broken") == (False, False)
        serve.terminate(60)
    finally:
        if serve.process is not None and serve.process.poll() is None:
            serve.kill_tree()


@pytest.mark.timeout(600)
def test_a_repository_that_starts_again_makes_the_server_not_ready_until_it_has_published(tmp_path):
    """The repository is killed and `shoal serve` starts it again: it says so first, and the
    gateway is not ready while the new one reads its models (one waits in its
    `auto_complete_config`), then ready once they are published and loaded."""
    repo = tmp_path / "models"
    repository_gate = tmp_path / "repository-gate"
    write_python(repo, "a_repository_slow", repository_gate=repository_gate)
    write_onnx(repo, "c_fast")
    repository_gate.touch()  # the first start reads it at once
    serve = Serve(tmp_path / "serve", [f"--model-repository={repo}"]).start(START_S)
    try:
        wait_until(lambda: readiness(serve) == (True, True), START_S, "the server ready", 0.2)
        repository_gate.unlink()
        waiting_marker = repository_gate.with_name(repository_gate.name + ".waiting")
        waiting_marker.unlink()
        [pid] = serve.pids("shoal.cli repository")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: waiting(repository_gate), START_S, "the new repository reading a", 0.2)
        wait_until(lambda: readiness(serve) == (False, False), START_S, "the server not ready", 0.2)
        repository_gate.touch()
        wait_until(lambda: readiness(serve) == (True, True), START_S, "the server ready again", 0.2)
        for name in ("a_repository_slow", "c_fast"):
            assert np.array_equal(infer(serve, name), np.arange(4, dtype=np.float32)), name
        serve.terminate(60)
    finally:
        repository_gate.touch()
        if serve.process is not None and serve.process.poll() is None:
            serve.kill_tree()
