"""`docker compose up` for real: the compose files build, start, serve, scale and survive faults.

Runs where a container engine answers (`docker info`) and a compose command is found; skips with
the reason elsewhere (tests/deploy/compose.py). Marked `deploy` and left out of the default run
(pyproject's addopts): it builds the image (about a minute) and runs for minutes. `.ci/run` runs it
as a step of its own, after the suite (docs/serving.md, "Deployment"):

    python -m pytest -q -m deploy tests/deploy

What it checks (issue 37): build, up, ready, inference through tritonclient over HTTP and gRPC,
metrics, three workers that all take batches (the model files reached them through NATS, no model
volume, fetched once for the host), a worker SIGKILLed under load, co-hosted
schedulers, the 3-node NATS cluster with the scheduler's node SIGKILLed under load, a gateway
SIGKILLed and restarted (still on the workers' shared memory), and `down -v` leaving nothing.
A fault may cost at most one request, answered with a clear error within `FAIL_WITHIN_S`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import urllib3

from shared.bus import connection
from shoal import topology
from tests.deploy.compose import Project
from tests.serving import record_until, wait_until

STARTING = (Exception,)  # a container still starting refuses connections: not yet

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(1800)]

FAIL_WITHIN_S = 5.0  # a request cut by a fault is answered (served, or a clear error) within this
READY_S = 180.0  # up -d to ready, on a loaded machine


# -- the client side --------------------------------------------------------------------------
def http(project: Project) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(project.url, network_timeout=60)


def simple_inputs(module) -> list:
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(x)
    return inputs


def served(client: httpclient.InferenceServerClient) -> bool:
    result = client.infer("simple", simple_inputs(httpclient))
    return bool(np.array_equal(result.as_numpy("OUTPUT0"), np.arange(16, dtype=np.int32).reshape(1, 16) * 2))


def wait_ready(project: Project) -> float:
    client = http(project)
    try:
        return wait_until(
            lambda: client.is_server_ready() and served(client), READY_S, "ready and serving 'simple'", 0.5, STARTING
        )
    finally:
        client.close()


def load(project: Project, stop: threading.Event, results: list) -> None:
    client = http(project)
    record_until(stop, results, lambda: served(client))
    client.close()


def under_load(project: Project, fault, clients: int = 4, after: int = 150) -> list:
    """`fault()` while `clients` threads infer; returns every request's (started, ended, ok, error)
    once `after` more requests succeeded after it."""
    results: list = []
    stop = threading.Event()
    threads = [threading.Thread(target=load, args=(project, stop, results)) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: sum(r[2] for r in results) > 50, 60, "load before the fault", 0.1, STARTING)
        fault()
        done = time.monotonic()
        wait_until(
            lambda: sum(r[2] and r[0] > done for r in results) > after, 120, "load after the fault", 0.1, STARTING
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(90)
    return results


def check_fault(results: list, what: str, project: Project | None = None) -> None:
    failures = [(end - started, error) for started, end, ok, error in results if not ok]
    slowest = max(end - started for started, end, *_ in results)
    print(f"{what}: {len(results)} requests, {len(failures)} failed {failures[:3]}, slowest {slowest:.2f}s")
    try:
        assert len(failures) <= 1, f"{what}: {failures}"
        assert all(error.startswith(("503", "500", "504")) for _, error in failures), failures
        assert slowest < FAIL_WITHIN_S, f"{what}: a request took {slowest:.1f}s"
    except AssertionError:
        if project is not None:  # what the services said, to tell which of them lost the request
            print(project.logs(tail=300))
        raise


def executions(project: Project) -> dict[str, int]:
    """Executions of `simple` per worker container (its hostname), from `shoal status`'s source."""
    services = asyncio.run(topology.collect(project.nats_url, wait=0.5, credentials=project.operator_credentials()))
    found: dict[str, int] = {}
    for service in services:
        if service["name"] == "shoal-worker":
            model = service.get("status", {}).get("models", {}).get("simple/1", {})
            found[service["metadata"]["host"]] = sum(i["executions"] for i in model.get("instance_list", []))
    return found


def hostname(project: Project, container: str) -> str:
    return str(project.inspect(container)["Config"]["Hostname"])


def shm_host(project: Project, container: str) -> str:
    """The host token in the container's /dev/shm: equal in processes that share memory."""
    return project.exec(
        container, "python", "-c", "from shared.memory.segments import host_token; print(host_token())"
    ).strip()


# -- the tests --------------------------------------------------------------------------------
def test_compose_serves_scales_survives_and_goes(project):
    stack = project()
    started = time.monotonic()
    stack.up()
    print(f"ready {wait_ready(stack) + (time.monotonic() - started):.1f}s after up -d")
    client = http(stack)
    assert client.get_model_metadata("simple")["name"] == "simple"
    grpc = grpcclient.InferenceServerClient(stack.grpc_url)
    result = grpc.infer("simple", simple_inputs(grpcclient))
    assert np.array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16), np.int32))
    grpc.close()
    metrics = urllib3.request("GET", f"http://127.0.0.1:{stack.metrics_port}/metrics").data.decode()
    assert 'nv_inference_count{model="simple",version="1"}' in metrics
    # the compose NATS admits only identities (docs/security.md): a client without one is refused at once
    with pytest.raises(connection.BusRefused, match="--nats-credentials"):
        asyncio.run(connection.connect(stack.nats_url, "test-no-credentials"))
    # ... and speaks TLS only (`shoal credentials --tls`, docs/security.md "TLS")
    host, port = stack.nats_url.removeprefix("nats://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        assert json.loads(sock.recv(4096)[5:])["tls_required"] is True

    # three workers, and every one takes batches
    stack.up("--scale", "worker=3")
    workers = stack.containers("worker")
    assert len(workers) == 3
    names = {hostname(stack, w) for w in workers}
    wait_until(lambda: set(executions(stack)) >= names, 60, "three workers on the bus", 0.5, STARTING)
    before = executions(stack)

    def all_three() -> bool:
        for _ in range(30):
            served(client)
        now = executions(stack)
        return all(now.get(n, 0) > before.get(n, 0) for n in names)

    wait_until(all_three, 120, "each of the three workers took batches", 0.5, STARTING)

    # no worker mounts the models: they came through NATS, fetched by the first worker alone and
    # found in the host's cache by the two others (--model-files=store)
    for worker in workers:
        assert "/models" not in [m["Destination"] for m in stack.inspect(worker)["Mounts"]]
    fetched = [w for w in workers if "fetched in" in stack.container_logs(w)]
    assert fetched == workers[:1], f"{len(fetched)} workers fetched model files"

    # a worker SIGKILLed under load: its running batch fails clearly, or is served elsewhere
    victim = workers[0]
    check_fault(under_load(stack, lambda: stack.crash(victim)), "worker killed", stack)

    # the gateway SIGKILLed: its restart serves again, on the workers' shared memory
    gateway = stack.containers("gateway")[0]
    restarts = stack.restarts(gateway)
    stack.crash(gateway)
    wait_until(lambda: stack.restarts(gateway) > restarts, 60, "the gateway restarted", 0.5, STARTING)
    wait_ready(stack)
    tokens = {shm_host(stack, w) for w in stack.containers("worker")}
    assert tokens == {shm_host(stack, gateway)}, "a restarted gateway no longer shares memory with the workers"
    client.close()


def arrivals(project: Project) -> tuple[int, int]:
    """Batches the workers took over NATS and over the local channel (their status, shoal status's source)."""
    services = asyncio.run(topology.collect(project.nats_url, wait=0.5, credentials=project.operator_credentials()))
    workers = [s.get("status", {}) for s in services if s["name"] == "shoal-worker"]
    return sum(w.get("batches_over_nats", 0) for w in workers), sum(w.get("batches_over_channel", 0) for w in workers)


def test_compose_cohosted_schedulers(project):
    stack = project(env={"SHOAL_COHOST_SCHEDULER": "true"})
    stack.up("--scale", "scheduler=0")
    wait_ready(stack)
    assert not stack.containers("scheduler")
    check_fault(under_load(stack, lambda: None, after=100), "co-hosted", stack)
    # the gateway reached the worker's local channel through the volume both mount (docs/design.md §9):
    # after the first batches, which open it, the batches crossed no nats-server
    over_nats, over_channel = arrivals(stack)
    assert over_channel > 10 * max(over_nats, 1), (over_nats, over_channel)


def connections(project: Project) -> dict[str, list[str]]:
    """Which node each service's connection is on (the nodes' /connz)."""
    found: dict[str, list[str]] = {}
    for service in ("nats", "nats-2", "nats-3"):
        for container in project.containers(service):
            connz = json.loads(project.exec(container, "wget", "-qO-", "http://127.0.0.1:8222/connz"))
            found[service] = sorted(c.get("name", "") for c in connz.get("connections") or [])
    return found


@pytest.mark.xfail(
    strict=False,
    reason="known defect, open (docs/reliability.md, 'Still open'): about one run in eight, two requests "
    "wait for their deadline after the scheduler's node dies while the worker reconnects twice",
)
def test_compose_nats_cluster_loses_the_schedulers_node_under_load(project):
    stack = project("docker-compose.yml", "docker-compose.nats-cluster.yml")
    stack.up()
    wait_ready(stack)

    def schedulers_node() -> str:
        for service in ("nats", "nats-2", "nats-3"):
            for container in stack.containers(service):
                connz = json.loads(stack.exec(container, "wget", "-qO-", "http://127.0.0.1:8222/connz"))
                if any(c.get("name", "").startswith("shoal-scheduler") for c in connz.get("connections") or []):
                    return container
        raise AssertionError("no node has the scheduler's connection")

    node = schedulers_node()
    print("the services' nodes:", connections(stack))
    check_fault(under_load(stack, lambda: stack.crash(node), after=300), "the scheduler's NATS node killed", stack)
