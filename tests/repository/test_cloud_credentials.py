"""services/repository/cloud_credentials.py: the credentials chosen for a bucket, as Triton's core
chooses them (environment variables, or the TRITON_CLOUD_CREDENTIAL_PATH file's longest match)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.repository.cloud_credentials import (
    AzureAuth,
    CredentialError,
    GcsAuth,
    S3Auth,
    azure_auth,
    from_file,
    gcs_auth,
    s3_auth,
)

URL = "as://acct/models/repo"


def test_azure_from_the_environment_as_triton():
    assert azure_auth(URL, {}) == AzureAuth("acct", "anonymous")
    assert azure_auth(URL, {"AZURE_STORAGE_KEY": "k"}) == AzureAuth("acct", "key", key="k")
    # AZURE_STORAGE_ACCOUNT names the account instead of the URL; the URL may give the blob host
    assert azure_auth(URL, {"AZURE_STORAGE_ACCOUNT": "other"}).account == "other"
    assert azure_auth("as://acct.blob.core.windows.net/models/repo", {}).account == "acct"
    # "key" with no key is anonymous, as in core's ASFileSystem
    assert azure_auth(URL, {"AZURE_STORAGE_AUTH_TYPE": "key"}).kind == "anonymous"


def test_azure_managed_identity_and_the_default_chain():
    system = {"AZURE_STORAGE_AUTH_TYPE": "managed_identity", "AZURE_STORAGE_KEY": "ignored"}
    assert azure_auth(URL, system) == AzureAuth("acct", "managed_identity")
    user = {"AZURE_STORAGE_AUTH_TYPE": "managed_identity", "AZURE_STORAGE_CLIENT_ID": "cid"}
    assert azure_auth(URL, user) == AzureAuth("acct", "managed_identity", client_id="cid")
    chain = {"AZURE_STORAGE_AUTH_TYPE": "default", "AZURE_STORAGE_CLIENT_ID": "cid"}
    assert azure_auth(URL, chain) == AzureAuth("acct", "default")


def test_a_connection_string_is_used_as_given():
    env = {"AZURE_STORAGE_CONNECTION_STRING": "BlobEndpoint=http://h/a;", "AZURE_STORAGE_KEY": "k"}
    assert azure_auth(URL, env) == AzureAuth("acct", "connection_string", connection_string="BlobEndpoint=http://h/a;")
    assert azure_auth(URL, {**env, "AZURE_STORAGE_AUTH_TYPE": "default"}).kind == "connection_string"


def test_s3_and_gcs_from_the_environment():
    env = {
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "t",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_PROFILE": "p",
    }
    assert s3_auth("s3://b/p", env) == S3Auth("id", "secret", "t", "eu-west-1", "p")
    assert s3_auth("s3://b/p", {}) == S3Auth()
    assert gcs_auth("gs://b/p", {"GOOGLE_APPLICATION_CREDENTIALS": "/k.json"}) == GcsAuth("/k.json")
    assert gcs_auth("gs://b/p", {"STORAGE_EMULATOR_HOST": "127.0.0.1:9"}) == GcsAuth("", "http://127.0.0.1:9")


def test_the_credential_file_as_tritons_docs_show_it(tmp_path):
    path = tmp_path / "cloud_credential.json"
    path.write_text(
        json.dumps(
            {
                "gs": {"": "/default.json", "gs://gcs-bucket-002": "/two.json"},
                "s3": {"s3://s3-bucket-002": {"secret_key": "s", "key_id": "i", "region": "r", "profile": "p"}},
                "as": {
                    "": {"account_str": "AZURE_STORAGE_ACCOUNT", "account_key": "k"},
                    "as://Account-MI/Container": {"auth_type": "managed_identity", "client_id": "cid"},
                },
            }
        )
    )
    env = {"TRITON_CLOUD_CREDENTIAL_PATH": str(path), "GOOGLE_APPLICATION_CREDENTIALS": "/not-read.json"}
    assert gcs_auth("gs://gcs-bucket-002/model_repository", env).credentials_path == "/two.json"
    assert gcs_auth("gs://any-other-gcs-bucket", env).credentials_path == "/default.json"
    assert s3_auth("s3://s3-bucket-002/repo", env) == S3Auth("i", "s", "", "r", "p")
    assert azure_auth("as://Account-MI/Container/repo", env) == AzureAuth(
        "Account-MI", "managed_identity", client_id="cid"
    )
    assert azure_auth("as://x/c/repo", env) == AzureAuth("AZURE_STORAGE_ACCOUNT", "key", key="k")
    with pytest.raises(CredentialError, match=r"^Cannot match credential for path  s3://other/repo$"):
        s3_auth("s3://other/repo", env)  # the file alone counts: no "" entry, no match


def test_an_unreadable_credential_file_says_so(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    for path in (tmp_path / "bad.json", tmp_path / "missing.json"):
        with pytest.raises(CredentialError, match="cannot read TRITON_CLOUD_CREDENTIAL_PATH"):
            gcs_auth("gs://b/p", {"TRITON_CLOUD_CREDENTIAL_PATH": str(path)})


def test_a_malformed_credential_file_says_what_is_wrong(tmp_path):
    """Not a traceback: the start stops with the file's name and what its entry should be."""
    cases = [
        ({"as": {"": "k"}}, azure_auth, "as://acct/c/p", "the 'as' entry '' must be an object of fields"),
        ({"s3": {"s3://b": ["x"]}}, s3_auth, "s3://b/p", "the 's3' entry 's3://b' must be an object of fields"),
        ({"gs": {"": {"path": "x"}}}, gcs_auth, "gs://b/p", "the 'gs' entry '' must be a key file's path"),
        ({"gs": ["x"]}, gcs_auth, "gs://b/p", "'gs' must map path prefixes to credentials"),
    ]
    for number, (content, auth, url, message) in enumerate(cases):
        (tmp_path / f"{number}.json").write_text(json.dumps(content))
        with pytest.raises(CredentialError, match=message):
            auth(url, {"TRITON_CLOUD_CREDENTIAL_PATH": str(tmp_path / f"{number}.json")})


names = st.text(alphabet="abc/:", max_size=8).map(lambda s: "gs://" + s)


@given(st.lists(names, min_size=1, max_size=6, unique=True), st.text(alphabet="abc/", max_size=10))
def test_the_longest_matching_name_wins(tmp_path_factory, entries, rest):
    path = tmp_path_factory.mktemp("creds") / "c.json"
    path.write_text(json.dumps({"gs": {name: name for name in entries}}))
    url = "gs://" + rest
    matching = [name for name in entries if url.startswith(name)]
    env = {"TRITON_CLOUD_CREDENTIAL_PATH": str(path)}
    if not matching:
        with pytest.raises(CredentialError):
            from_file("gs", url, env)
    else:
        assert from_file("gs", url, env) == max(matching, key=len)
