"""The OpenAI front end with API keys (--openai-api-key-file), through the official `openai`
client against the real services: a client without an allowed key gets `AuthenticationError`
(OpenAI's 401 shape) on every /v1 route, one with a key of the file is served, and the
orchestrator's readiness probe needs none."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from shared.process.natsserver import free_port
from tests.cluster import Running, running_cluster
from tests.integration.openai_models import write_openai_models


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root = write_openai_models(tmp_path_factory.mktemp("openai_keys"))
    keys = tmp_path_factory.mktemp("secrets") / "openai-keys"
    keys.write_text("# one key a line\nsk-first\nsk-second\n")
    keys.chmod(0o600)
    port = free_port()
    with running_cluster(root, openai_address="127.0.0.1", openai_port=port, openai_api_key_file=str(keys)) as running:
        yield running


def client(served: Running, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{served.cluster.gateway.openai_port}/v1", api_key=key, max_retries=0
    )


def test_a_client_without_an_allowed_key_is_refused_on_every_route(served: Running):
    with client(served, "sk-wrong") as wrong:
        with pytest.raises(openai.AuthenticationError) as refused:
            wrong.models.list()
        assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            wrong.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.AuthenticationError):
            wrong.completions.create(model="plain", prompt="hi", stream=True)
        with pytest.raises(openai.AuthenticationError):
            wrong.embeddings.create(model="hashing", input="hi")


def test_a_request_with_no_key_at_all_gets_openais_401_body(served: Running):
    url = f"http://127.0.0.1:{served.cluster.gateway.openai_port}/v1/models"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=10)
    assert refused.value.code == 401
    error = json.loads(refused.value.read())["error"]
    assert error["type"] == "invalid_request_error" and "didn't provide an API key" in error["message"]


def test_each_key_of_the_file_is_served(served: Running):
    for key in ("sk-first", "sk-second"):
        with client(served, key) as allowed:
            answer = allowed.chat.completions.create(model="echo", messages=[{"role": "user", "content": "one two"}])
            assert answer.choices[0].message.content == "one two"


def test_the_readiness_probe_needs_no_key(served: Running):
    url = f"http://127.0.0.1:{served.cluster.gateway.openai_port}/health/ready"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
