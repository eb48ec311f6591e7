"""nats-server restarts: every service reconnects by itself, requests meanwhile end by their
deadline with a clear error, and the control plane (KV watches) works again afterwards."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from services.repository import examples
from tests.cluster import identity_config, running_cluster
from tests.serving import Serve, listening, wait_until


def infer(client, model: str) -> None:
    value = np.arange(4, dtype=np.float32).reshape(1, 4)
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(value)
    np.testing.assert_array_equal(client.infer(model, [tensor]).as_numpy("OUTPUT0"), value)


def test_services_recover_from_a_nats_restart(tmp_path):
    for name in ("first", "second"):
        examples.write_model(
            tmp_path, name, examples.identity_graph(TensorProto.FLOAT, 2, name), identity_config(name, "FP32")
        )
    with running_cluster(
        tmp_path, repository={"model_control_mode": "explicit", "load_model": ["first"]}, request_timeout_s=3
    ) as running:
        client = httpclient.InferenceServerClient(running.url, network_timeout=30)
        infer(client, "first")
        running.nats.restart()
        deadline = time.monotonic() + 60
        while True:
            started = time.monotonic()
            try:
                infer(client, "first")
                break
            except InferenceServerException as exc:  # while services reconnect: clear errors only
                assert exc.status() in ("503", "500", "404"), exc
                assert exc.message()
            assert time.monotonic() - started < 10, "a request outlived its deadline"
            assert time.monotonic() < deadline, "serving did not resume after the NATS restart"
            time.sleep(0.1)
        # the control plane works again: a load goes through the KV watches of every service
        client.load_model("second")
        infer(client, "second")
        client.close()


@pytest.mark.timeout(400)
def test_shoal_serve_restarts_a_killed_nats_server(tmp_path):
    """kill -9 of the embedded nats-server: `shoal serve` starts it again on the same port with the
    same JetStream store, every service reconnects (one 'Connection refused' at most per service),
    a model load works afterwards and SIGTERM still stops everything within the exit timeout."""
    models = tmp_path / "models"
    for name in ("first", "second"):
        examples.write_model(
            models, name, examples.identity_graph(TensorProto.FLOAT, 2, name), identity_config(name, "FP32")
        )
    serve = Serve(
        tmp_path / "run",
        [
            f"--model-repository={models}",
            "--model-control-mode=explicit",
            "--load-model=first",
            "--request-timeout-secs=5",
            "--exit-timeout-secs=15",
        ],
    ).start()
    try:
        client = httpclient.InferenceServerClient(serve.url, network_timeout=30)
        infer(client, "first")
        [nats_pid] = serve.pids("nats-server")
        port = int(serve.nats_url.rsplit(":", 1)[1])
        killed = time.monotonic()
        os.kill(nats_pid, signal.SIGKILL)
        wait_until(lambda: serve.pids("nats-server") not in ([], [nats_pid]) and listening(port), 20, "no new nats")

        def serving() -> bool:
            started = time.monotonic()
            try:
                infer(client, "first")
                return True
            except InferenceServerException as exc:  # while services reconnect: clear errors only
                assert exc.status() in ("503", "500", "404") and exc.message(), exc
                assert time.monotonic() - started < 5 + 2, "a request outlived its deadline"
                return False

        wait_until(serving, 30, "serving did not resume after nats-server was killed")
        print(f"serving again {time.monotonic() - killed:.1f}s after the kill")
        client.load_model("second")  # the control plane (configs, states) survived in the file store
        infer(client, "second")
        assert client.is_model_ready("first")
        client.close()
        time.sleep(2)  # an outage that floods the log shows within seconds: give it the time to
        refused = serve.log().count("Connection refused")
        assert refused <= 5, f"{refused} 'Connection refused' lines for one outage"
        assert serve.terminate(15 + 5) <= 15 + 5
    finally:
        if serve.process.poll() is None:
            serve.kill_tree()
