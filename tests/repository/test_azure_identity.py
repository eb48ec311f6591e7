"""Azure Managed Identity for `as://` repositories (Triton server #8652): `AZURE_STORAGE_AUTH_TYPE`
picks azure-identity's ManagedIdentityCredential (user-assigned with `AZURE_STORAGE_CLIENT_ID`) or its
DefaultAzureCredential chain, and adlfs reads the bucket with it.

Without Azure, what is tested is the chain chosen and the token request it makes: azure-identity
asks the identity endpoint that App Service and Azure Arc give a process (`IDENTITY_ENDPOINT`,
`IDENTITY_HEADER`) for a token for Azure Storage; here that endpoint is a small HTTP server of the
test's own on a free port. That the storage service accepts the token cannot be tested here
(Azurite takes bearer tokens over HTTPS only, from its own issuer check)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from services.repository.cloud_credentials import azure_auth
from services.repository.remote import azure_credential, filesystem

pytest.importorskip("adlfs", reason="the Azure tests need adlfs (pip install -e '.[test]')")
STORAGE = "https://storage.azure.com/.default"


@pytest.fixture
def identity_endpoint(monkeypatch) -> Iterator[list[dict]]:
    """An identity endpoint in App Service's form; the requests it answered, their query and header."""
    asked: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
            asked.append({**query, "header": self.headers.get("X-IDENTITY-HEADER")})
            body = json.dumps(
                {
                    "access_token": "token-from-the-test",
                    "expires_on": str(int(time.time()) + 3600),
                    "resource": query.get("resource"),
                    "token_type": "Bearer",
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for name in ("AZURE_STORAGE_KEY", "AZURE_STORAGE_CONNECTION_STRING", "TRITON_CLOUD_CREDENTIAL_PATH"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID", "AZURE_FEDERATED_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)  # DefaultAzureCredential's other sources stay out
    monkeypatch.setenv("IDENTITY_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}/msi/token")
    monkeypatch.setenv("IDENTITY_HEADER", "header-from-the-test")
    try:
        yield asked
    finally:
        server.shutdown()
        server.server_close()


async def token_of(url: str) -> str:
    async with azure_credential(azure_auth(url)) as credential:
        return (await credential.get_token(STORAGE)).token


def test_a_user_assigned_managed_identity_asks_for_a_storage_token(identity_endpoint, monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_AUTH_TYPE", "managed_identity")
    monkeypatch.setenv("AZURE_STORAGE_CLIENT_ID", "client-id-from-the-test")
    assert asyncio.run(token_of("as://acct/models/repo")) == "token-from-the-test"
    [asked] = identity_endpoint
    assert asked["resource"] == "https://storage.azure.com"
    assert asked["client_id"] == "client-id-from-the-test" and asked["header"] == "header-from-the-test"


def test_a_system_assigned_managed_identity_names_no_client(identity_endpoint, monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_AUTH_TYPE", "managed_identity")
    monkeypatch.delenv("AZURE_STORAGE_CLIENT_ID", raising=False)
    assert asyncio.run(token_of("as://acct/models/repo")) == "token-from-the-test"
    [asked] = identity_endpoint
    assert "client_id" not in asked and asked["resource"] == "https://storage.azure.com"


def test_the_default_chain_reaches_the_managed_identity(identity_endpoint, monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_AUTH_TYPE", "default")
    assert asyncio.run(token_of("as://acct/models/repo")) == "token-from-the-test"
    assert [asked["resource"] for asked in identity_endpoint] == ["https://storage.azure.com"]


def test_adlfs_is_given_the_chosen_credential(monkeypatch):
    from azure.identity.aio import DefaultAzureCredential, ManagedIdentityCredential

    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
    for kind, expected in (("managed_identity", ManagedIdentityCredential), ("default", DefaultAzureCredential)):
        monkeypatch.setenv("AZURE_STORAGE_AUTH_TYPE", kind)
        fs, prefix = filesystem(f"as://acct-{kind.replace('_', '-')}/models/repo")
        assert isinstance(fs.credential, expected) and prefix == "models/repo"
        assert fs.account_url == f"https://acct-{kind.replace('_', '-')}.blob.core.windows.net"
