"""One real cluster per fuzz module (nats-server and the services, the gateway unsupervised so that
a crash shows), on a small repository: the example models and a BYTES identity."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster import running_cluster
from tests.gateway.fuzz.doors import Doors, fuzz_repository, raise_fd_limit


@pytest.fixture(scope="module")
def doors(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Doors]:
    """The module's cluster; a module's `GATEWAY` dict adds gateway settings (shorter timeouts)."""
    raise_fd_limit()
    root = fuzz_repository(tmp_path_factory.mktemp("fuzz_models"))
    gateway = {"allow_client_shm": True, "http_max_input_size": 1 << 20, **getattr(request.module, "GATEWAY", {})}
    with running_cluster(root, supervise=False, **gateway) as running:
        yield Doors(running)
