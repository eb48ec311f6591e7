"""services/repository/remote.py against a real S3-compatible server (moto's, tests/s3.py): the
mirror follows the bucket (new, changed and removed files), one model at a time or all of it, and
what cannot be read says why."""

from __future__ import annotations

import pytest

from services.repository.remote import RemoteError, RemoteRepository, filesystem, is_remote
from tests.s3 import CREDENTIALS, running_s3


@pytest.fixture
def s3(tmp_path, monkeypatch):
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    with running_s3(tmp_path / "moto.log") as server:
        server.client().create_bucket(Bucket="models")
        yield server


def test_urls():
    assert is_remote("s3://bucket/path") and is_remote("gs://b/p") and is_remote("as://account/container/p")
    assert not is_remote("/models") and not is_remote("models")
    fs, prefix = filesystem("s3://127.0.0.1:9000/bucket/some/path/")
    assert prefix == "bucket/some/path" and fs.client_kwargs["endpoint_url"] == "http://127.0.0.1:9000"
    fs, prefix = filesystem("s3://https://example.com:9000/bucket/p")
    assert prefix == "bucket/p" and fs.client_kwargs["endpoint_url"] == "https://example.com:9000"
    assert filesystem("s3://bucket/p")[1] == "bucket/p"


def test_the_mirror_follows_the_bucket(s3, tmp_path):
    client = s3.client()
    for key, body in {"repo/a/config.pbtxt": b"a", "repo/a/1/model.onnx": b"one", "repo/b/1/x": b"x"}.items():
        client.put_object(Bucket="models", Key=key, Body=body)
    client.put_object(Bucket="models", Key="elsewhere/z", Body=b"not ours")
    remote = RemoteRepository(s3.url("models", "repo"), tmp_path / "mirrors")
    assert remote.sync() == 3
    mirror = remote.mirror
    assert (mirror / "a" / "1" / "model.onnx").read_bytes() == b"one" and (mirror / "b" / "1" / "x").is_file()
    assert not (mirror / "z").exists() and not (mirror / "elsewhere").exists()
    assert remote.sync() == 0  # nothing changed: nothing fetched
    client.put_object(Bucket="models", Key="repo/a/1/model.onnx", Body=b"one, changed")
    client.put_object(Bucket="models", Key="repo/a/2/model.onnx", Body=b"two")
    client.delete_object(Bucket="models", Key="repo/b/1/x")
    assert remote.sync("a") == 2  # one model: b's removal waits for a sync of b or of all
    assert (mirror / "a" / "1" / "model.onnx").read_bytes() == b"one, changed" and (mirror / "b" / "1" / "x").exists()
    assert remote.sync() == 1
    assert not (mirror / "b").exists()  # its directories went with its last file


def test_what_cannot_be_read_says_why(s3, tmp_path):
    with pytest.raises(RemoteError, match="cannot list s3://"):
        RemoteRepository(s3.url("no-such-bucket", "repo"), tmp_path / "mirrors").sync()
