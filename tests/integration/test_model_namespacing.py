"""`--model-namespacing=true`, as Triton's qa/L0_model_namespacing runs it: two repositories each
hold a model `composing` (one passes its input through, the other negates it) and an ensemble
of their own that uses `composing`; each ensemble takes its own repository's, a request for
`composing` by name is ambiguous (Triton's text), the index lists both, and load/unload by name
act on every repository's model of that name."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from services.repository import examples
from shared.process.natsserver import free_port
from tests.cluster import identity_config
from tests.serving import wait_until
from tests.shoal.serving import serve

AMBIGUOUS = (
    "There are 2 identifiers of model 'composing' in global map, model namespace must be provided to resolve ambiguity."
)


def ensemble_config(name: str) -> str:
    return (
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "composing" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }\n'
    )


def repository(root: Path, ensemble: str, negate: bool) -> Path:
    graph = examples.identity_graph(TensorProto.FLOAT, 2, "composing")
    if negate:
        graph.node[0].op_type = "Neg"
    examples.write_model(root, "composing", graph, identity_config("composing", "FP32"))
    (root / ensemble / "1").mkdir(parents=True)
    (root / ensemble / "config.pbtxt").write_text(ensemble_config(ensemble))
    return root


def infer(client: httpclient.InferenceServerClient, model: str) -> np.ndarray:
    data = np.array([[1.5, -2.0]], dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer(model, [tensor])
    assert result.get_response()["model_name"] == model
    return result.as_numpy("OUTPUT0") / data


def test_each_repository_is_a_namespace(tmp_path):
    a = repository(tmp_path / "models" / "a", "ensemble_a", negate=False)
    b = repository(tmp_path / "models" / "b", "ensemble_b", negate=True)
    grpc_port, metrics_port = free_port(), free_port()
    flags = (
        f"--model-repository={b}",
        "--model-namespacing=true",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
    )
    with serve(a, tmp_path / "cache", *flags) as running:
        running.wait_for("Started HTTPService")
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}", network_timeout=120)
        np.testing.assert_array_equal(infer(client, "ensemble_a"), [[1.0, 1.0]])  # a's composing
        np.testing.assert_array_equal(infer(client, "ensemble_b"), [[-1.0, -1.0]])  # b's composing
        with pytest.raises(InferenceServerException, match=AMBIGUOUS):
            infer(client, "composing")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        with pytest.raises(InferenceServerException, match=AMBIGUOUS):
            grpc.get_model_metadata("composing")
        assert grpc.get_model_metadata("ensemble_b").name == "ensemble_b"
        grpc.close()
        entries = [(e["name"], e.get("state")) for e in client.get_model_repository_index()]
        assert sorted(entries) == sorted(
            [("composing", "READY"), ("composing", "READY"), ("ensemble_a", "READY"), ("ensemble_b", "READY")]
        )
        assert client.get_model_metadata("ensemble_a")["name"] == "ensemble_a"
        stats = client.get_inference_statistics()["model_stats"]
        assert sorted(entry["name"] for entry in stats) == ["composing", "composing", "ensemble_a", "ensemble_b"]
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as response:
            metrics = response.read().decode()
        for namespace in (a, b):  # Triton's labels: the model's name and its repository
            assert f'nv_inference_request_success{{model="composing",namespace="{namespace}",version="1"}} 1' in metrics
        client.close()


def test_load_and_unload_by_name_act_on_every_namespace(tmp_path):
    a = repository(tmp_path / "models" / "a", "ensemble_a", negate=False)
    b = repository(tmp_path / "models" / "b", "ensemble_b", negate=True)
    flags = (f"--model-repository={b}", "--model-namespacing=true", "--model-control-mode=explicit")
    with serve(a, tmp_path / "cache", *flags) as running:
        running.wait_for("Started HTTPService")
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}", network_timeout=120)
        # its step's model by name, as Triton's polling chain: every repository's `composing`
        client.load_model("ensemble_b")
        np.testing.assert_array_equal(infer(client, "ensemble_b"), [[-1.0, -1.0]])  # its own repository's
        with pytest.raises(InferenceServerException, match=AMBIGUOUS):
            infer(client, "composing")
        states = [(e["name"], e.get("state")) for e in client.get_model_repository_index()]
        assert states.count(("composing", "READY")) == 2 and ("ensemble_a", None) in states
        client.unload_model("composing")  # every repository's: the ensemble loses its step
        wait_until(lambda: not client.is_model_ready("ensemble_b"), 60, "ensemble_b unavailable")
        states = [(e["name"], e.get("state")) for e in client.get_model_repository_index()]
        assert states.count(("composing", "UNAVAILABLE")) == 2
        client.load_model("ensemble_a")
        np.testing.assert_array_equal(infer(client, "ensemble_a"), [[1.0, 1.0]])
        # b's `composing` came back with a's load (by name; the load answered once it had settled, as
        # Triton's): ensemble_b follows it
        wait_until(lambda: client.is_model_ready("ensemble_b"), 60, "ensemble_b READY again")
        np.testing.assert_array_equal(infer(client, "ensemble_b"), [[-1.0, -1.0]])
        client.close()
