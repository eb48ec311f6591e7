"""`shoal serve` takes every child with it, even when it is SIGKILLed, and a new one starts on
the same ports and removes what the killed one left in the temporary directory (shared/process/scratch.py);
a stop finishes within --exit-timeout-secs (docs/reliability.md)."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import tritonclient.http as httpclient

from services.repository import examples
from tests.integration.ensemble_models import write_python
from tests.serving import Serve, alive, listening, wait_until


def repository(root):
    examples.write_examples(root)
    write_python(root, "py_double", "double")  # a python model: one more process (per model) in the tree
    return root


def infer_mlp(url: str) -> None:
    client = httpclient.InferenceServerClient(url, network_timeout=30)
    tensor = httpclient.InferInput("INPUT0", [1, 256], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 256), np.float32))
    assert client.infer("mlp", [tensor]).as_numpy("OUTPUT0").shape == (1, 16)
    client.close()


@pytest.mark.timeout(400)
def test_sigkill_of_the_supervisor_leaves_no_process_and_no_port(tmp_path, monkeypatch):
    models = repository(tmp_path / "models")
    scratch = tmp_path / "tmp"  # the services' temporary directory, to see what they leave there
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    serve = Serve(tmp_path / "run", [f"--model-repository={models}", "--exit-timeout-secs=10"]).start()
    second = None
    try:
        infer_mlp(serve.url)
        tree, ports = serve.tree(), serve.ports()
        # nats-server, repository, worker, python model, gateway (hosting the scheduler by default)
        assert len(tree) >= 5, tree
        os.kill(serve.process.pid, signal.SIGKILL)
        serve.process.wait()
        wait_until(lambda: not [pid for pid in tree if alive(pid)], 15, "children outlived their supervisor")
        wait_until(lambda: not [p for p in ports if listening(p)], 15, "ports still listening")
        (killed,) = scratch.glob("shoal-nats-*")  # its JetStream store: nobody left to remove it
        # the next `shoal serve` gets the same HTTP, metrics and monitoring ports
        second = Serve(
            tmp_path / "run2",
            serve.args,
            http_port=serve.http_port,
            metrics_port=serve.metrics_port,
            monitor_port=serve.monitor_port,
            grpc_port=serve.grpc_port,
        ).start()
        infer_mlp(second.url)
        assert not killed.exists() and len(list(scratch.glob("shoal-nats-*"))) == 1
        tree = second.tree()
        assert second.terminate(10 + 5) <= 10 + 5
        assert second.process.returncode == 0
        wait_until(lambda: not [pid for pid in tree if alive(pid)], 10, "children outlived a clean stop")
        assert list(scratch.glob("shoal-*")) == []
    finally:
        for running in (serve, second):
            if running is not None and running.process.poll() is None:
                running.kill_tree()
