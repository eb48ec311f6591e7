"""`--model-repository=s3://...`, `gs://...`, `as://...`: a Triton repository in a bucket (a real
server of each cloud on a free port: moto for S3, gcp-storage-emulator for GCS, Azurite for Azure;
tests/buckets.py), read by the repository service alone (the worker gets the files through NATS),
polled and loaded like a local directory; what cannot be read stops `shoal serve` with Triton's
text."""

from __future__ import annotations

import pytest
import tritonclient.http as httpclient

from services.repository import examples
from tests.azurite import ACCOUNT, running_azurite
from tests.buckets import KINDS, running_bucket
from tests.cluster import identity_config, running_cluster
from tests.integration.test_model_files import answer, model_bytes, scale_graph
from tests.serving import Serve, wait_until

WRONG_KEY = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmcta2V5LXdyb25nLWtleQ=="


@pytest.fixture(scope="module", params=KINDS)
def server(request, tmp_path_factory):
    """One server of each cloud for the module's tests (each test its own prefix): a server per
    test started nine in all, about 6 s each on a loaded machine."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        with running_bucket(request.param, tmp_path_factory.mktemp(request.param), monkeypatch) as bucket:
            yield bucket


@pytest.fixture
def bucket(server, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the repository's mirror, each test its own
    return server


def test_a_bucket_is_polled_and_loaded_like_a_directory(bucket, tmp_path):
    local = tmp_path / "upload"
    examples.write_model(local, "scaled", scale_graph(2), identity_config("scaled", "FP32"))
    bucket.upload_tree("repo", local)
    with running_cluster(
        bucket.url("repo"),
        repository={"model_control_mode": "poll", "repository_poll_secs": 1, "model_files": "store"},
        worker={"model_cache_dir": str(tmp_path / "worker-cache")},
    ) as running:
        client = httpclient.InferenceServerClient(running.url, network_timeout=60)
        assert answer(client) == 2.0
        index = {m["name"]: m.get("state") for m in client.get_model_repository_index()}
        assert index == {"scaled": "READY"}
        # the bucket changes: a new file for the model, and a new model
        bucket.put("repo/scaled/1/model.onnx", model_bytes(3))
        examples.write_model(local, "other", scale_graph(7), identity_config("other", "FP32"))
        bucket.upload_tree("repo/other", local / "other")
        wait_until(lambda: answer(client) == 3.0, 60, "the changed file served", errors=(Exception,))
        wait_until(lambda: answer(client, "other") == 7.0, 60, "the new model served", errors=(Exception,))
        # and a model gone from the bucket is unloaded, as a folder removed from a local repository
        bucket.delete("repo/other/config.pbtxt")
        bucket.delete("repo/other/1/model.onnx")
        wait_until(lambda: not client.is_model_ready("other"), 60, "the removed model unloaded")
        client.close()


def test_explicit_loads_read_the_bucket_as_it_is_then(bucket, tmp_path):
    local = tmp_path / "upload"
    examples.write_model(local, "scaled", scale_graph(4), identity_config("scaled", "FP32"))
    bucket.upload_tree("explicit", local)  # not the polling test's prefix: the server is the module's
    with running_cluster(
        bucket.url("explicit"),
        repository={"model_control_mode": "explicit", "model_files": "store"},
        worker={"model_cache_dir": str(tmp_path / "worker-cache")},
    ) as running:
        client = httpclient.InferenceServerClient(running.url, network_timeout=60)
        client.load_model("scaled")
        assert answer(client) == 4.0
        bucket.put("explicit/scaled/1/model.onnx", model_bytes(5))
        client.load_model("scaled")
        assert answer(client) == 5.0
        client.unload_model("scaled")
        wait_until(lambda: not client.is_model_ready("scaled"), 60, "the model unloaded")
        client.close()


def start_failure(tmp_path, url: str) -> str:
    """`shoal serve --model-repository=<url>` that must end at start: its output. The other
    services are still starting (waiting for the repository's models bucket) when it ends: they
    stop on its SIGTERM at once, not killed at the end of the exit timeout (30 s by default)."""
    serve = Serve(tmp_path / "serve", [f"--model-repository={url}"]).start(wait=False)
    try:
        code = serve.process.wait(240)
    finally:
        if serve.process.poll() is None:
            serve.kill_tree()
    assert code != 0, serve.log()
    assert "did not stop within the exit timeout" not in serve.log(), serve.log()
    return serve.log()


@pytest.mark.timeout(300)  # a whole `shoal serve` starting and stopping, on a loaded machine
def test_a_missing_bucket_stops_the_serve_with_tritons_text(bucket, tmp_path):
    url = bucket.url("repo").replace("/models/", "/no-such-bucket/")
    out = start_failure(tmp_path, url)
    # core's ModelRepositoryManager::Poll logs `failed to poll model repository '<path>': <reason>`
    assert f"failed to poll model repository '{url}'" in out, out


@pytest.mark.timeout(300)
def test_a_wrong_azure_key_stops_the_serve_with_the_servers_refusal(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with running_azurite(tmp_path / "azurite") as azurite:
        with azurite.client() as client:
            client.create_container("models")
        azurite.put("models", "repo/m/config.pbtxt", b'name: "m"')
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string(WRONG_KEY))
        url = azurite.url("models", "repo")
        out = start_failure(tmp_path, url)
    assert f"failed to poll model repository '{url}'" in out, out
    assert "AuthorizationFailure" in out or "Server failed to authenticate the request" in out, out
    assert url.startswith(f"as://{ACCOUNT}/")
