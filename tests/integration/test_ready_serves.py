"""A model that says READY serves: a request that finds no scheduler replica subscribed to its
model yet (start, a lease moving between replicas or after one died) waits for one instead of
failing at once (docs/reliability.md, "A model no scheduler serves yet")."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from services.repository import examples
from tests.cluster import identity_config, running_cluster
from tests.integration.test_reliability import call, lease_holder
from tests.serving import wait_until


@pytest.mark.timeout(300)
def test_a_request_while_the_lease_moves_waits_for_the_new_holder(tmp_path):
    """The gateway whose replica holds the model's lease is killed: the lease stays the dead
    replica's until it expires (4 s), and a request to the other gateway meanwhile waits for the
    surviving replica to take the model over, then is served."""
    examples.write_model(
        tmp_path, "m", examples.identity_graph(TensorProto.FLOAT, 2, "m"), identity_config("m", "FP32")
    )
    with running_cluster(tmp_path, gateways=2, supervise=False, shape="cohost") as running:
        gateways = {g.gateway_id: g for g in (running.cluster.gateway, *running.cluster.more_gateways)}
        wait_until(lambda: lease_holder(running, "m") is not None, 30, "no replica serves the model")
        owner = lease_holder(running, "m")
        other = next(g for gid, g in gateways.items() if gid != owner)
        url = f"127.0.0.1:{other.http_port}"  # its requests go over the bus to the owner's replica
        value = np.arange(4, dtype=np.float32).reshape(1, 4)
        assert np.array_equal(call(url, "m", value)[1], value)
        next(c for c in running.cluster.children if c.settings is gateways[owner]).process.kill()
        _, result = call(url, "m", value)
        assert isinstance(result, np.ndarray), str(result)
        assert lease_holder(running, "m") == other.gateway_id
