"""Model files through NATS (`--model-files=store`, the repository's default): each loaded version's
files go into the JetStream object store, and the worker loads from its own cached copy of them
(services/worker/model_files.py). Loads, version changes, reloads of a changed file, `file:`
overrides and on-demand loads all work that way; a file already in the cache is not fetched again.
(tests/integration/test_hosts.py runs it with no path shared between the hosts at all.)"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
from pathlib import Path

import nats
import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from services.repository import examples
from shared.bus import file_store
from tests.cluster import identity_config, running_cluster
from tests.files import next_tick
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


def test_a_file_swapped_in_the_object_store_is_refused_by_every_worker(tmp_path):
    """Two workers, two hosts' caches (docs/security.md "Model files"): a cached file changed on one
    host is fetched again; a file replaced in the object store behind the repository's back fails
    the load on both with the reason, and what it holds is never served."""
    root, caches = tmp_path / "models", [tmp_path / "cache-a", tmp_path / "cache-b"]
    examples.write_model(root, "scaled", scale_graph(2), identity_config("scaled", "FP32", 8))
    original = (root / "scaled" / "1" / "model.onnx").read_bytes()
    digest = hashlib.sha256(original).hexdigest()
    swapped = model_bytes(7)  # a model that answers 7: were it loaded, the answers would say so
    assert len(swapped) == len(original)  # only the digest tells them apart
    with running_cluster(
        root,
        repository={"model_control_mode": "explicit", "load_model": ["scaled"], "model_files": "store"},
        workers_settings=[{"model_cache_dir": str(cache)} for cache in caches],
    ) as running:
        client = httpclient.InferenceServerClient(running.url, network_timeout=60)
        wait_until(lambda: all((c / "blobs" / digest).exists() for c in caches), 60, "both workers fetched")

        # on one host, the cached file changed: that worker fetches it again at the reload
        blob = caches[0] / "blobs" / digest
        next_tick(blob)
        os.chmod(blob, 0o600)
        blob.write_bytes(swapped)
        client.load_model("scaled")
        assert {answer(client) for _ in range(8)} == {2.0}
        assert blob.read_bytes() == original

        # in the store, behind the repository's back: no worker loads it
        client.unload_model("scaled")
        wait_until(lambda: not client.is_model_ready("scaled"), 30, "'scaled' unloaded")
        asyncio.run(replace_object(running.nats.url, digest, swapped))
        for cache in caches:
            shutil.rmtree(cache)  # hosts that never fetched it
        with pytest.raises(InferenceServerException, match="scaled"):
            client.load_model("scaled")
        (entry,) = [e for e in client.get_model_repository_index() if e["name"] == "scaled"]
        assert entry["state"] == "UNAVAILABLE", entry
        assert "file '1/model.onnx': the object store's copy of file sha256:" in entry["reason"], entry
        assert "does not match the SHA-256 the repository published" in entry["reason"], entry
        assert not client.is_model_ready("scaled")
        with pytest.raises(InferenceServerException):
            answer(client)
        for cache in caches:  # each worker tried, and kept nothing
            assert not (cache / "blobs" / digest).exists() and not list((cache / "trees").glob("*")), cache
            assert (cache / "partial").is_dir()

        # repaired as docs/security.md says: the object removed, the next load uploads it again
        asyncio.run(remove_object(running.nats.url, digest))
        client.load_model("scaled")
        assert {answer(client) for _ in range(8)} == {2.0}
        client.close()


async def replace_object(url: str, digest: str, data: bytes) -> None:
    nc = await nats.connect(url)
    store = await file_store.open_store(nc)
    await store.put(file_store.object_name(digest), data)
    await nc.close()


DOUBLE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)])
            for r in requests
        ]
"""


def test_a_python_model_swapped_in_the_object_store_never_runs(tmp_path):
    """The code a python model's process would run (isolation: a process per instance) is refused
    like any file: the swapped model.py, which leaves a file behind when imported, never runs."""
    root, cache, ran = tmp_path / "models", tmp_path / "cache", tmp_path / "ran"
    (root / "double" / "1").mkdir(parents=True)
    (root / "double" / "1" / "model.py").write_text(DOUBLE)
    (root / "double" / "config.pbtxt").write_text(
        identity_config("double", "FP32").replace('backend: "onnxruntime"', 'backend: "python"')
    )
    original = (root / "double" / "1" / "model.py").read_bytes()
    swapped = f"open({str(ran)!r}, 'w').write('ran')\n".encode()
    swapped += b"#" * (len(original) - len(swapped) - 1) + b"\n"
    with running_cluster(
        root,
        repository={"model_control_mode": "explicit", "load_model": ["double"], "model_files": "store"},
        worker={"model_cache_dir": str(cache), "python_isolation": "instance"},
    ) as running:
        client = httpclient.InferenceServerClient(running.url, network_timeout=60)
        assert answer(client, "double") == 2.0
        client.unload_model("double")
        wait_until(lambda: not client.is_model_ready("double"), 30, "'double' unloaded")
        asyncio.run(replace_object(running.nats.url, hashlib.sha256(original).hexdigest(), swapped))
        shutil.rmtree(cache)
        with pytest.raises(InferenceServerException, match="double"):
            client.load_model("double")
        (entry,) = [e for e in client.get_model_repository_index() if e["name"] == "double"]
        assert entry["state"] == "UNAVAILABLE" and "file '1/model.py'" in entry["reason"], entry
        assert "does not match the SHA-256 the repository published" in entry["reason"], entry
        assert not ran.exists()
        client.close()


async def remove_object(url: str, digest: str) -> None:
    nc = await nats.connect(url)
    await file_store.delete(await file_store.open_store(nc), digest)
    await nc.close()
