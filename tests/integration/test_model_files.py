"""Model files through NATS (`--model-files=store`, the repository's default): each loaded version's
files go into the JetStream object store, and the worker loads from its own cached copy of them
(services/worker/model_files.py). Loads, version changes, reloads of a changed file, `file:`
overrides and on-demand loads all work that way; a file already in the cache is not fetched again.
(tests/integration/test_hosts.py runs it with no path shared between the hosts at all.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from services.repository import examples
from tests.cluster import identity_config, running_cluster
from tests.serving import wait_until

LATEST = "version_policy: { latest { num_versions: 1 } }\n"


def scale_graph(k: float) -> onnx.GraphProto:
    """OUTPUT0 = INPUT0 * k: which file a worker loaded shows in its answers."""
    dims = ["batch", "d0"]
    return helper.make_graph(
        [helper.make_node("Mul", ["INPUT0", "K"], ["OUTPUT0"])],
        "scaled",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, dims)],
        [helper.make_tensor("K", TensorProto.FLOAT, [], [k])],
    )


def model_bytes(k: float) -> bytes:
    model = helper.make_model(scale_graph(k), opset_imports=examples.OPSET, producer_name="shoal")
    model.ir_version = examples.IR_VERSION
    return model.SerializeToString()


def answer(client: httpclient.InferenceServerClient, model: str = "scaled") -> float:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return float(client.infer(model, [tensor]).as_numpy("OUTPUT0")[0, 0])


def cached(cache: Path) -> set[str]:
    return {p.name for p in (cache / "blobs").iterdir()} if (cache / "blobs").is_dir() else set()


def test_loads_version_changes_reloads_and_overrides_come_through_nats(tmp_path):
    root, cache = tmp_path / "models", tmp_path / "cache"
    examples.write_model(root, "scaled", scale_graph(2), identity_config("scaled", "FP32", 8, LATEST))
    (root / "scaled" / "labels.txt").write_text("a\nb\n")  # a file beside the versions travels too
    with running_cluster(
        root,
        repository={"model_control_mode": "explicit", "load_model": ["scaled"], "model_files": "store"},
        worker={"model_cache_dir": str(cache)},
    ) as running:
        client = httpclient.InferenceServerClient(running.url, network_timeout=60)
        assert answer(client) == 2.0
        first = cached(cache)
        assert len(first) == 3  # config.pbtxt, labels.txt, 1/model.onnx
        (tree,) = (cache / "trees").iterdir()
        assert (tree / "labels.txt").read_text() == "a\nb\n" and (tree / "1" / "model.onnx").is_file()

        # a new version: only its file is fetched, and it serves
        examples.write_model(root, "scaled", scale_graph(3), None, version=2)
        client.load_model("scaled")
        assert answer(client) == 3.0
        assert client.get_model_metadata("scaled")["versions"] == ["2"]
        assert cached(cache) - first and len(cached(cache) - first) == 1

        # the same version's file changed in place: a reload fetches the new content
        (root / "scaled" / "2" / "model.onnx").write_bytes(model_bytes(4))
        client.load_model("scaled")
        assert answer(client) == 4.0

        # a load with files (`file:`): the override directory's files go the same way
        config = json.dumps({"name": "scaled", "backend": "onnxruntime", "max_batch_size": 8})
        client.load_model("scaled", config=config, files={"file:1/model.onnx": model_bytes(5)})
        assert answer(client) == 5.0
        client.close()


def test_an_on_demand_load_comes_through_nats(tmp_path):
    root, cache = tmp_path / "models", tmp_path / "cache"
    examples.write_model(root, "scaled", scale_graph(6), identity_config("scaled", "FP32"))
    with running_cluster(
        root,
        repository={"model_control_mode": "on-demand", "model_files": "store"},
        worker={"model_cache_dir": str(cache)},
    ) as running:
        client = httpclient.InferenceServerClient(running.url, network_timeout=60)
        wait_until(lambda: answer(client) == 6.0, 60, "the on-demand load served", errors=(Exception,))
        assert len(cached(cache)) == 2
        client.close()
