"""Shoal across separate hosts (tests/hosts.py: network namespaces on one bridge, each with its
own /dev/shm and its own node of one NATS cluster): the gateway, scheduler and repository on
host 1, a worker on each of hosts 2 and 3 (docs/reliability.md, "Across hosts").

A request is served by a worker on another host with its large tensors sent as bytes over the
bus (a shared-memory handle cannot cross hosts); a slow link still carries them intact; a worker
host cut off under load costs only clear errors within the request timeout while the other host
keeps serving, and serves again when its link is back; the NATS node on the cut-off host leaves
the control plane (KV with 3 replicas) working on the majority side.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from services.repository import examples
from shared.memory import segments
from shoal import topology
from tests.cluster import identity_config
from tests.hosts import HTTP_PORT, Host, Hosts, namespaces_refused, running_hosts
from tests.serving import record_until, wait_until

TIMEOUT_S = 5.0  # the gateway's request timeout
WORKER_TIMEOUT_S = 3.0  # the heartbeat fallback: a partition NATS has not noticed yet

pytestmark = pytest.mark.timeout(300)


def write_models(root: Path) -> None:
    for name in ("big", "second"):
        examples.write_model(
            root, name, examples.identity_graph(TensorProto.FLOAT, 2, name), identity_config(name, "FP32", 8)
        )


def executions(hosts: Hosts) -> dict[str, int]:
    """Executions of `big` per host, from the workers' micro status (`shoal status`)."""
    services = asyncio.run(topology.collect(hosts.nats_url(hosts[1]), wait=0.3))
    found: dict[str, int] = {}
    for service in services:
        if service["name"] == "shoal-worker":
            model = service.get("status", {}).get("models", {}).get("big/1", {})
            runs = sum(i["executions"] for i in model.get("instance_list", []))
            found[service["metadata"]["host"]] = runs
    return found


def client(host: Host) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"{host.address}:{HTTP_PORT}", network_timeout=60)  # host 1


def infer(connection: httpclient.InferenceServerClient, value: np.ndarray, model: str = "big") -> np.ndarray:
    tensor = httpclient.InferInput("INPUT0", list(value.shape), "FP32")
    tensor.set_data_from_numpy(value, binary_data=True)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    result = connection.infer(model, [tensor], outputs=[output])
    return np.asarray(result.as_numpy("OUTPUT0"))


def serving_on_both_worker_hosts(hosts: Hosts) -> None:
    """Every worker host runs `big`: requests until each has executed some."""
    connection = client(hosts[1])
    value = np.ones((1, 4), np.float32)

    def both() -> bool:
        for _ in range(8):
            infer(connection, value)
        return all(executions(hosts).get(h.name, 0) > 0 for h in hosts.hosts[1:])

    wait_until(both, 60, "a worker host never served")
    connection.close()


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    refused = namespaces_refused()
    if refused:
        pytest.skip(refused)
    models = tmp_path_factory.mktemp("models")
    write_models(models)
    with running_hosts(3) as running:
        patient = {"worker_timeout_s": WORKER_TIMEOUT_S}
        running.serve(
            models,
            repository={"model_control_mode": "explicit", "load_model": ["big"], **patient},
            gateway={"request_timeout_s": TIMEOUT_S},
            scheduler=patient,
            worker={"heartbeat_s": 0.5},
        )
        gateway = running[1]

        def ready() -> bool:
            try:
                connection = client(gateway)
                try:
                    return bool(connection.is_model_ready("big"))
                finally:
                    connection.close()
            except Exception:
                return False

        try:
            gateway.call(wait_until, ready, 120, "the gateway on host 1 never had 'big' ready")
            gateway.call(serving_on_both_worker_hosts, running)
        except AssertionError:
            print(running.logs())
            raise
        yield running


def node_bytes(host: Host) -> int:
    """Bytes this host's NATS node sent out (to its clients and routes)."""
    assert host.nats is not None
    return int(host.call(host.nats.monitor, "varz")["out_bytes"])


def test_large_tensors_cross_hosts_as_bytes(hosts: Hosts) -> None:
    """Every worker is on another host than the gateway: each large input goes to it as bytes
    over the bus (the /dev/shm handle means nothing there) and comes back the same way."""
    name = Path(segments.host_file()).name
    tokens = {h.name: (h.shm_dir / name).read_text() for h in hosts.hosts if (h.shm_dir / name).exists()}
    assert len(set(tokens.values())) == len(tokens) >= 2, tokens  # each host has its own shared memory
    rng = np.random.default_rng(7)
    small = rng.standard_normal((1, 16), dtype=np.float32)
    large = rng.standard_normal((2, 512 * 1024), dtype=np.float32)  # 4 MiB: far above the inline limit
    before = {h.name: node_bytes(h) for h in hosts.hosts[1:]}

    def exchange() -> None:
        connection = client(hosts[1])
        np.testing.assert_array_equal(infer(connection, small), small)
        for _ in range(3):
            np.testing.assert_array_equal(infer(connection, large), large)
        connection.close()

    hosts[1].call(exchange)
    moved = sum(node_bytes(h) - before[h.name] for h in hosts.hosts[1:])
    # three 4 MiB inputs reached the worker hosts through their nodes (their outputs went back)
    assert moved >= 3 * large.nbytes, f"{moved} bytes through the worker hosts' nodes"
    leftovers = [p.name for h in hosts.hosts for p in h.shm_dir.glob("shoal_*")]
    assert not leftovers, leftovers  # every segment made on the way was freed


def test_a_slow_link_carries_large_tensors_intact(hosts: Hosts) -> None:
    """The gateway's host behind a 40 Mbit/s link (tbf, both ways): large tensors still arrive whole."""
    gateway = hosts[1]
    value = np.random.default_rng(3).standard_normal((1, 256 * 1024), dtype=np.float32)  # 1 MiB
    gateway.limit("40mbit")
    try:

        def exchange() -> float:
            connection = client(gateway)
            started = time.monotonic()
            for _ in range(3):
                np.testing.assert_array_equal(infer(connection, value), value)
            connection.close()
            return time.monotonic() - started

        seconds = gateway.call(exchange)
    finally:
        gateway.unlimit()
    # 3 x 1 MiB each way is 50 Mbit: the link, not a shortcut, carried it
    assert seconds > 1.0, f"{seconds:.2f}s: the bandwidth limit was not on the path"


def test_models_reach_the_worker_hosts_without_a_shared_disk(hosts: Hosts) -> None:
    """The worker hosts see nothing of the repository's directory: 'big' reached them through NATS
    (the repository published its files into the object store, each worker fetched them into its
    own host's cache), and so does 'second', loaded now."""
    models = hosts[2].hidden[0]
    for host in hosts.hosts[1:]:
        listing = subprocess.run(host.command(["ls", "-A", str(models)]), capture_output=True, text=True, timeout=30)
        assert listing.returncode == 0 and listing.stdout == "", f"{host.name} sees {listing.stdout!r}"
    assert any((models / "big").iterdir())  # the repository's host does
    connection = hosts[1].call(client, hosts[1])
    hosts[1].call(connection.load_model, "second")
    value = np.arange(4, dtype=np.float32).reshape(1, 4)
    np.testing.assert_array_equal(hosts[1].call(infer, connection, value, "second"), value)
    hosts[1].call(connection.close)
    for host in hosts.hosts[1:]:
        trees = list((hosts.workdir / f"{host.name}-model-files" / "trees").iterdir())
        assert len(trees) == 2, f"{host.name}: {trees}"  # 'big' and 'second', each fetched on this host
    connection = hosts[1].call(client, hosts[1])
    hosts[1].call(connection.unload_model, "second")  # as the tests after this one expect
    hosts[1].call(connection.close)


def load(host: Host, stop: threading.Event, results: list) -> None:
    connection = client(host)
    value = np.arange(4, dtype=np.float32).reshape(1, 4)
    record_until(stop, results, lambda: np.array_equal(infer(connection, value), value))
    connection.close()


def test_a_worker_host_cut_off_under_load_then_back(hosts: Hosts) -> None:
    """Host 3's link goes down under load: its requests fail with a clear error or are served
    elsewhere within the request timeout, host 2 keeps serving, and host 3 serves again once
    its link is back."""
    gateway, victim = hosts[1], hosts[3]
    results: list = []
    stop = threading.Event()
    clients = [gateway.thread(load, gateway, stop, results) for _ in range(4)]
    try:
        wait_until(lambda: sum(ok for *_, ok, _ in results) > 20, 30, "no load before the cut")
        cut = time.monotonic()
        victim.cut()
        wait_until(lambda: any(ok and s > cut + 1 for s, _, ok, _ in results), 20, "host 2 did not go on serving")
        time.sleep(WORKER_TIMEOUT_S + 1)  # past the heartbeat fallback: host 3 is out for sure
        healed = time.monotonic()
        victim.heal()
        before = gateway.call(executions, hosts).get(victim.name, 0)
        back = wait_until(
            lambda: gateway.call(executions, hosts).get(victim.name, 0) > before + 5,
            30,
            "host 3 did not serve again after its link came back",
        )
    finally:
        stop.set()
        for thread in clients:
            thread.join(60)
    slowest = max(end - started for started, end, *_ in results)
    failures = [error for *_, ok, error in results if not ok]
    ends = sorted(end for _, end, ok, _ in results if ok and end > cut)
    stall = max(b - a for a, b in zip([cut, *ends], ends))
    print(
        f"{len(results)} requests, {len(failures)} failed, longest time without a success {stall:.1f}s, "
        f"slowest request {slowest:.1f}s, host 3 serving again {back:.1f}s after its link came back "
        f"({healed - cut:.1f}s cut off)"
    )
    assert slowest < TIMEOUT_S + 2, f"a request took {slowest:.1f}s (timeout {TIMEOUT_S}s)"
    assert all(e.startswith(("503", "500", "504")) and len(e) > 4 for e in failures), failures[:5]


def test_the_control_plane_works_on_the_majority_side_of_a_partition(hosts: Hosts) -> None:
    """Host 3 (a worker and a NATS node) cut off: the KV buckets have 3 replicas, so hosts 1 and 2
    still load, unload and answer status."""
    gateway, victim = hosts[1], hosts[3]
    assert gateway.nats is not None
    jsz = gateway.call(gateway.nats.monitor, "jsz?streams=true&config=true")
    replicas = {
        s["name"]: s["config"]["num_replicas"]
        for account in jsz.get("account_details", [])
        for s in account.get("stream_detail", [])
    }
    assert replicas and all(n == 3 for n in replicas.values()), replicas
    victim.cut()
    try:

        def control_plane() -> None:
            connection = client(gateway)

            def load_second() -> bool:  # the KV's leaders move to the majority side first
                try:
                    connection.load_model("second")
                    return bool(connection.is_model_ready("second"))
                except InferenceServerException:
                    return False

            took = wait_until(load_second, 30, "no load of 'second' with host 3 cut off", step=0.5)
            value = np.ones((1, 4), np.float32)

            def serves() -> bool:  # the scheduler claims the model through the leases bucket: it may trail
                try:
                    return bool(np.array_equal(infer(connection, value, "second"), value))
                except InferenceServerException as exc:
                    assert exc.status() == "503", exc
                    return False

            wait_until(serves, 30, "'second' not served on the majority side", step=0.5)
            assert {m["name"]: m.get("state") for m in connection.get_model_repository_index()}["big"] == "READY"
            connection.unload_model("second")
            wait_until(lambda: not connection.is_model_ready("second"), 10, "'second' still ready after its unload")
            connection.close()
            print(f"load on the majority side {took:.1f}s after the cut")

        gateway.call(control_plane)
    finally:
        victim.heal()
    assert victim.nats is not None
    victim.call(victim.nats.wait_healthy, 60)  # the node rejoined its cluster
