"""`shoal serve --gateways N`: gateway processes sharing one HTTP port (SO_REUSEPORT) all serve."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import tritonclient.http as httpclient

from shared.process.natsserver import NatsServer, free_port
from shared.process.settings import GatewaySettings, RepositorySettings, SchedulerSettings, WorkerSettings
from shoal.layout_flags import port_sharing_gateways
from shoal.supervisor import Cluster
from tests.cluster import build_test_repository
from tests.serving import wait_until


def _published_by_gateway(nats: NatsServer) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{nats.monitor_port}/connz?limit=1024", timeout=10) as r:
        connections = json.load(r)["connections"]
    return {c["name"]: c["in_msgs"] for c in connections if c.get("name", "").startswith("shoal-gateway-")}


def _infer_on_a_new_connection(url: str, value: int) -> None:
    client = httpclient.InferenceServerClient(url)  # a new connection: the kernel picks a gateway
    try:
        a = np.full((1, 16), value, np.int32)
        inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        result = client.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    finally:
        client.close()


def test_two_gateways_share_the_http_port_and_both_serve(tmp_path):
    root = build_test_repository(tmp_path / "models")
    nats = NatsServer().start()
    common = {"nats_url": nats.url}
    first = GatewaySettings(
        **common,
        http_address="127.0.0.1",
        http_port=free_port(),
        metrics_port=free_port(),
        grpc_address="127.0.0.1",
        grpc_port=free_port(),
    )
    gateway, more = port_sharing_gateways(first, 2)
    assert len(more) == 1 and more[0].http_port == gateway.http_port and more[0].gateway_id != gateway.gateway_id
    cluster = Cluster(
        gateway,
        SchedulerSettings(**common),
        RepositorySettings(**common, model_repository=str(root)),
        [WorkerSettings(**common)],
        more_gateways=more,
    )
    try:
        cluster.start()
        cluster.wait_ready(90)
        url = f"127.0.0.1:{gateway.http_port}"
        before = _published_by_gateway(nats)
        served: dict[str, int] = {}
        sent = [0]

        def both_sent_on() -> bool:  # a request on a new connection each time, until both gateways sent some on
            _infer_on_a_new_connection(url, sent[0])
            sent[0] += 1
            served.update((name, n - before.get(name, 0)) for name, n in _published_by_gateway(nats).items())
            return len(served) == 2 and all(n > 0 for n in served.values())

        wait_until(both_sent_on, 60, "both gateways sending requests on", 0, detail=lambda: served)
    finally:
        cluster.stop(timeout=10)
        nats.stop()
