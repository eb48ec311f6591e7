from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from hypothesis import HealthCheck, settings

from shared.process.natsserver import NatsServer
from tests.cluster import Running, build_test_repository, running_cluster

# The properties are checked as written; only the wall-clock checks go: on a loaded machine (CI's two
# cores, or a suite run in parallel) one example or one draw can take a second for reasons of its own.
settings.register_profile("loaded-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("loaded-machine")


@pytest.fixture(scope="module")
def nats_server() -> Iterator[NatsServer]:
    """A real nats-server on a free port, shared by the tests of one module."""
    with NatsServer() as running:
        yield running


@pytest.fixture(scope="session")
def test_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def shoal(test_repository: Path) -> Running:
    """One real system (nats-server + every service) shared by the integration tests."""
    with running_cluster(test_repository, http_max_input_size=80 * 2**20) as running:
        yield running


@pytest.fixture
def client(shoal: Running) -> httpclient.InferenceServerClient:
    c = httpclient.InferenceServerClient(shoal.url, network_timeout=60)
    yield c
    c.close()
