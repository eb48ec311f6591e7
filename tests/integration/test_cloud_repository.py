"""`--model-repository=s3://...`: a Triton repository in an S3 bucket (a real S3-compatible server,
moto's, on a free port: tests/s3.py), read by the repository service alone (the worker gets the
files through NATS), polled and loaded like a local directory."""

from __future__ import annotations

import pytest
import tritonclient.http as httpclient

from services.repository import examples
from tests.cluster import identity_config, running_cluster
from tests.integration.test_model_files import answer, model_bytes, scale_graph
from tests.s3 import CREDENTIALS, running_s3
from tests.serving import wait_until


@pytest.fixture
def s3(tmp_path, monkeypatch):
    for name, value in CREDENTIALS.items():  # the services inherit them: the usual AWS variables
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the repository's mirror
    with running_s3(tmp_path / "moto.log") as server:
        server.client().create_bucket(Bucket="models")
        yield server


def test_a_bucket_is_polled_and_loaded_like_a_directory(s3, tmp_path):
    local = tmp_path / "upload"
    examples.write_model(local, "scaled", scale_graph(2), identity_config("scaled", "FP32"))
    s3.upload_tree("models", "repo", local)
    with running_cluster(
        s3.url("models", "repo"),
        repository={"model_control_mode": "poll", "repository_poll_secs": 1, "model_files": "store"},
        worker={"model_cache_dir": str(tmp_path / "worker-cache")},
    ) as running:
        client = httpclient.InferenceServerClient(running.url, network_timeout=60)
        assert answer(client) == 2.0
        index = {m["name"]: m.get("state") for m in client.get_model_repository_index()}
        assert index == {"scaled": "READY"}
        # the bucket changes: a new file for the model, and a new model
        s3.client().put_object(Bucket="models", Key="repo/scaled/1/model.onnx", Body=model_bytes(3))
        examples.write_model(local, "other", scale_graph(7), identity_config("other", "FP32"))
        s3.upload_tree("models", "repo/other", local / "other")
        wait_until(lambda: answer(client) == 3.0, 60, "the changed file served", errors=(Exception,))
        wait_until(lambda: answer(client, "other") == 7.0, 60, "the new model served", errors=(Exception,))
        client.close()


def test_explicit_loads_read_the_bucket_as_it_is_then(s3, tmp_path):
    local = tmp_path / "upload"
    examples.write_model(local, "scaled", scale_graph(4), identity_config("scaled", "FP32"))
    s3.upload_tree("models", "repo", local)
    with running_cluster(
        s3.url("models", "repo"),
        repository={"model_control_mode": "explicit", "model_files": "store"},
        worker={"model_cache_dir": str(tmp_path / "worker-cache")},
    ) as running:
        client = httpclient.InferenceServerClient(running.url, network_timeout=60)
        client.load_model("scaled")
        assert answer(client) == 4.0
        s3.client().put_object(Bucket="models", Key="repo/scaled/1/model.onnx", Body=model_bytes(5))
        client.load_model("scaled")
        assert answer(client) == 5.0
        client.close()
