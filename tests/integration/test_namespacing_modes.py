"""`--model-namespacing=true` beyond qa/L0_model_namespacing's case, as Triton's core behaves
(model_repository_manager.cc): the namespace is the repository as typed (a relative path stays
relative, in the `namespace` metric label and in load errors, `ModelIdentifier::str()`);
errors about a request name its model as the client does; a load by name answers once every
repository's model of that name has settled (READY or failed); poll and on-demand modes."""

from __future__ import annotations

import shutil
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shared.process.natsserver import free_port
from tests.cluster import identity_config
from tests.integration.test_model_namespacing import AMBIGUOUS, infer, repository
from tests.serving import wait_until
from tests.shoal.serving import serve

GATED = """
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        deadline = time.monotonic() + 120
        while not Path({gate!r}).exists():  # the test opens the gate once it has seen the load wait
            if time.monotonic() > deadline:
                raise RuntimeError("the gate never opened")
            time.sleep(0.05)
        {fail}

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", -pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests
        ]
"""


def gated_composing(root: Path, gate: Path, fail: bool = False) -> None:
    """A python `composing` (negates) whose load waits for `gate`, and then fails if asked."""
    (root / "composing" / "1").mkdir(parents=True)
    why = 'raise RuntimeError("composing refuses to load")' if fail else "pass"
    (root / "composing" / "1" / "model.py").write_text(GATED.format(gate=str(gate), fail=why))
    config = identity_config("composing", "FP32").replace('backend: "onnxruntime"', 'backend: "python"')
    (root / "composing" / "config.pbtxt").write_text(config)


def sequence_model(root: Path) -> None:
    (root / "seq" / "1").mkdir(parents=True)
    (root / "seq" / "1" / "model.py").write_text(GATED.format(gate="/", fail="pass"))
    config = identity_config("seq", "FP32").replace('backend: "onnxruntime"', 'backend: "python"')
    (root / "seq" / "config.pbtxt").write_text(config + "sequence_batching { }\n")


def index(client: httpclient.InferenceServerClient) -> list[tuple[str, str | None]]:
    return sorted((e["name"], e.get("state")) for e in client.get_model_repository_index())


def test_the_namespace_is_the_repository_as_typed(tmp_path):
    repository(tmp_path / "models" / "a", "ensemble_a", negate=False)
    repository(tmp_path / "models" / "b", "ensemble_b", negate=True)
    sequence_model(tmp_path / "models" / "b")
    metrics_port = free_port()
    flags = ("--model-repository=models/b", "--model-namespacing=true", f"--metrics-port={metrics_port}")
    with serve(Path("models/a"), tmp_path / "cache", *flags, cwd=tmp_path) as running:
        running.wait_for("Started HTTPService")
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}", network_timeout=120)
        np.testing.assert_array_equal(infer(client, "ensemble_b"), [[-1.0, -1.0]])
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as response:
            metrics = response.read().decode()
        assert 'nv_inference_request_success{model="composing",namespace="models/b",version="1"} 1' in metrics
        # the sequence batcher's refusal names the model as the client does, not "models/b::seq"
        data = np.array([[1.0, 2.0]], dtype=np.float32)
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("seq", [tensor])
        assert "inference request to model 'seq' must specify a non-zero or non-empty correlation ID" in str(
            refused.value
        )
        client.close()


def test_a_load_by_name_answers_once_every_repositorys_model_has_settled(tmp_path):
    gate = tmp_path / "gate"
    repository(tmp_path / "models" / "a", "ensemble_a", negate=False)
    gated_composing(tmp_path / "models" / "b", gate)
    flags = ("--model-repository=models/b", "--model-namespacing=true", "--model-control-mode=explicit")
    with serve(Path("models/a"), tmp_path / "cache", *flags, cwd=tmp_path) as running:
        running.wait_for("Started HTTPService")
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}", network_timeout=180)
        url = f"127.0.0.1:{running.http_port}"

        def load() -> None:  # its own client: tritonclient.http's is not shared between threads
            httpclient.InferenceServerClient(url, network_timeout=180).load_model("ensemble_a")

        loading = threading.Thread(target=load)  # its step by name: a's and b's `composing`
        loading.start()
        wait_until(lambda: client.is_model_ready("ensemble_a"), 120, "ensemble_a READY")
        loading.join(5)  # a's models are ready; b's `composing` still waits at its gate
        assert loading.is_alive(), "the load answered before b's composing settled"
        gate.touch()
        loading.join(120)
        assert not loading.is_alive()
        assert index(client).count(("composing", "READY")) == 2  # at the answer, not some time after
        client.close()


def test_a_failed_load_names_each_failure_by_its_identity_as_typed(tmp_path):
    gate = tmp_path / "gate"
    gate.touch()
    repository(tmp_path / "models" / "a", "ensemble_a", negate=False)
    gated_composing(tmp_path / "models" / "b", gate, fail=True)
    flags = ("--model-repository=models/b", "--model-namespacing=true", "--model-control-mode=explicit")
    with serve(Path("models/a"), tmp_path / "cache", *flags, cwd=tmp_path) as running:
        running.wait_for("Started HTTPService")
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}", network_timeout=180)
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("composing")
        text = str(failed.value)
        assert "load failed for model 'models/b::composing'" in text and "composing refuses to load" in text
        assert "models/a::composing" not in text  # a's loaded: only the failure is said
        assert ("composing", "READY") in index(client)
        client.close()


def test_poll_mode_follows_each_repository(tmp_path):
    a = repository(tmp_path / "models" / "a", "ensemble_a", negate=False)
    b = repository(tmp_path / "models" / "b", "ensemble_b", negate=True)
    flags = (
        f"--model-repository={b}",
        "--model-namespacing=true",
        "--model-control-mode=poll",
        "--repository-poll-secs=1",
    )
    with serve(a, tmp_path / "cache", *flags) as running:
        running.wait_for("Started HTTPService")
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}", network_timeout=120)
        with pytest.raises(InferenceServerException, match=AMBIGUOUS):
            infer(client, "composing")
        shutil.rmtree(a / "composing")  # a's composing goes
        wait_until(lambda: index(client).count(("composing", "READY")) == 1, 60, "one composing left")
        np.testing.assert_array_equal(infer(client, "composing"), [[-1.0, -1.0]])  # unique again: b's
        np.testing.assert_array_equal(infer(client, "ensemble_b"), [[-1.0, -1.0]])
        client.close()


def test_on_demand_mode_loads_the_requested_namespaces_model(tmp_path):
    a = repository(tmp_path / "models" / "a", "ensemble_a", negate=False)
    b = repository(tmp_path / "models" / "b", "ensemble_b", negate=True)
    flags = (f"--model-repository={b}", "--model-namespacing=true", "--model-control-mode=on-demand")
    with serve(a, tmp_path / "cache", *flags) as running:
        running.wait_for("Started HTTPService")
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}", network_timeout=120)
        np.testing.assert_array_equal(infer(client, "ensemble_b"), [[-1.0, -1.0]])  # loads b's composing
        np.testing.assert_array_equal(infer(client, "ensemble_a"), [[1.0, 1.0]])  # and a's
        with pytest.raises(InferenceServerException, match=AMBIGUOUS):
            infer(client, "composing")
        assert index(client).count(("composing", "READY")) == 2
        client.close()
