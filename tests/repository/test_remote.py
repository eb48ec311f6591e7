"""services/repository/remote.py against a real server of each cloud (tests/buckets.py: moto for
S3, gcp-storage-emulator for GCS, Azurite for Azure): the mirror follows the bucket (new, changed
and removed files), one model at a time or all of it, and what cannot be read says why."""

from __future__ import annotations

import pytest

from services.repository.remote import RemoteError, RemoteRepository, filesystem, is_remote
from tests.buckets import KINDS, running_bucket


@pytest.fixture(params=KINDS)
def bucket(request, tmp_path, monkeypatch):
    with running_bucket(request.param, tmp_path, monkeypatch) as bucket:
        yield bucket


def test_urls():
    assert is_remote("s3://bucket/path") and is_remote("gs://b/p") and is_remote("as://account/container/p")
    assert not is_remote("/models") and not is_remote("models")
    fs, prefix = filesystem("s3://127.0.0.1:9000/bucket/some/path/")
    assert prefix == "bucket/some/path" and fs.client_kwargs["endpoint_url"] == "http://127.0.0.1:9000"
    fs, prefix = filesystem("s3://https://example.com:9000/bucket/p")
    assert prefix == "bucket/p" and fs.client_kwargs["endpoint_url"] == "https://example.com:9000"
    assert filesystem("s3://bucket/p")[1] == "bucket/p"


def test_the_mirror_follows_the_bucket(bucket, tmp_path):
    for key, body in {"repo/a/config.pbtxt": b"a", "repo/a/1/model.onnx": b"one", "repo/b/1/x": b"x"}.items():
        bucket.put(key, body)
    bucket.put("elsewhere/z", b"not ours")
    remote = RemoteRepository(bucket.url("repo"), tmp_path / "mirrors")
    assert remote.sync() == 3
    mirror = remote.mirror
    assert (mirror / "a" / "1" / "model.onnx").read_bytes() == b"one" and (mirror / "b" / "1" / "x").is_file()
    assert not (mirror / "z").exists() and not (mirror / "elsewhere").exists()
    assert remote.sync() == 0  # nothing changed: nothing fetched
    bucket.put("repo/a/1/model.onnx", b"one, changed")
    bucket.put("repo/a/2/model.onnx", b"two")
    bucket.delete("repo/b/1/x")
    assert remote.sync("a") == 2  # one model: b's removal waits for a sync of b or of all
    assert (mirror / "a" / "1" / "model.onnx").read_bytes() == b"one, changed" and (mirror / "b" / "1" / "x").exists()
    assert remote.sync() == 1
    assert not (mirror / "b").exists()  # its directories went with its last file


def test_what_cannot_be_read_says_why(bucket, tmp_path):
    url = bucket.url("repo").replace("/models/", "/no-such-bucket/")
    with pytest.raises(RemoteError, match=f"cannot list {bucket.kind}://"):
        RemoteRepository(url, tmp_path / "mirrors").sync()


def test_the_chosen_credentials_reach_the_filesystems(tmp_path, monkeypatch):
    """No server needed: what each library is handed (the choice itself: test_cloud_credentials.py)."""
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_AUTH_TYPE", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "cloud_credential.json"
    path.write_text(
        '{"s3": {"s3://127.0.0.1:9/b": {"key_id": "i", "secret_key": "s", "region": "eu-west-1"}},'
        ' "as": {"": {"account_str": "other", "account_key": "a2V5"}}}'
    )
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(path))
    fs, _ = filesystem("s3://127.0.0.1:9/b/p")
    assert (fs.key, fs.secret, fs.client_kwargs["region_name"]) == ("i", "s", "eu-west-1")
    fs, prefix = filesystem("as://acct/container/p")
    assert (fs.account_name, fs.account_key, prefix) == ("other", "a2V5", "container/p")
    with pytest.raises(RemoteError, match="Cannot match credential for path  s3://elsewhere/p"):
        filesystem("s3://elsewhere/p")
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH")
    fs, _ = filesystem("as://acct/container/p")  # no key, no auth type: anonymous, as Triton
    assert fs.account_name == "acct" and fs.anon is True and fs.credential is None
