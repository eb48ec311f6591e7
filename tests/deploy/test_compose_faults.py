"""Faults in the real deployment under load (issue 47 item 2): every container kind killed and
brought back in turn, a worker cut off the network for 20 s, and `docker compose restart`.

One project on the 3-node NATS cluster override with two workers, four HTTP clients inferring
`simple` the whole time. For each fault it records which requests failed and with what, the
slowest request, and how long until the next success: from the fault where another replica
serves on (a worker, a NATS node), from the container's return where it is the only one (the
gateway, the scheduler, the repository, the whole project). docs/reliability.md quotes the table
it prints. Marked `deploy` (tests/deploy/test_compose.py says how to run these).

What it asserts, from the issue: no request waits past its deadline without an answer (here: none
takes longer than `SLOWEST_S`); the next success within `NEXT_SUCCESS_S` of the reference; the
partitioned worker rejoins and serves on its own.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from services.scheduler.replicas.leases import REFRESH_S, TTL_S
from tests.deploy.compose import Project, run
from tests.deploy.test_compose import STARTING, executions, hostname, served, wait_ready
from tests.serving import wait_until

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(2400)]

NEXT_SUCCESS_S = 5.0  # the bound: a success within this of the reference
# A lone scheduler's successor takes the dead process's leases once NATS has found no responders for
# it twice, a round apart, after a settling of its own (replicas/takeover.py); by then, on a host
# where the container takes a few seconds to start, the leases have usually expired (TTL_S after
# the last renewal, up to REFRESH_S before the kill) and are claimed on the next round: up to about
# 6 s after the kill either way (measured 3.85-4.46 s after the return; docs/reliability.md).
SCHEDULER_NEXT_SUCCESS_S = TTL_S + 2 * REFRESH_S
SLOWEST_S = 30.0  # no request waits this long: each is answered (served or refused) well before its deadline
PARTITION_S = 20.0  # how long the worker is cut off (the figure)
CLIENTS = 4


@dataclass
class Outcome:
    fault: str
    requests: int
    failed: collections.Counter[str]
    slowest_s: float
    next_success_s: float
    reference: str  # "fault" or "return"

    def row(self) -> str:
        failed = ", ".join(f"{n} × {kind}" for kind, n in self.failed.most_common()) or "none"
        return (
            f"| {self.fault} | {self.requests} | {failed} | {self.slowest_s:.2f} s | "
            f"{self.next_success_s:.2f} s after the {self.reference} |"
        )


class Traffic:
    """`CLIENTS` threads inferring `simple` over HTTP until stopped; each request's (started, ended,
    ok, what failed). A refused connection (the gateway away) is recorded, not raised."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self.results: list[tuple[float, float, bool, str]] = []
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CLIENTS)]

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(90)

    def _client(self) -> None:
        client = httpclient.InferenceServerClient(self.project.url, network_timeout=60)
        while not self.stopped.is_set():
            started = time.monotonic()
            try:
                ok, error = served(client), ""
            except Exception as exc:  # refused connections included: the client sees them too
                ok, error = False, kind_of(exc)
                client.close()  # a connection the gateway's death left broken is not reused
                client = httpclient.InferenceServerClient(self.project.url, network_timeout=60)
            self.results.append((started, time.monotonic(), ok, error))
            if not ok:
                time.sleep(0.05)  # a failing client backs off instead of spinning
        client.close()

    def successes_since(self, moment: float) -> int:
        return sum(ok and started >= moment for started, _, ok, _ in list(self.results))

    def around(self, begun: float) -> list[tuple[float, float, bool, str]]:
        """The requests still running at `begun` or started after it."""
        return [r for r in list(self.results) if r[1] >= begun]


def kind_of(exc: Exception) -> str:
    """An answer's status and text, or what the connection did (refused, reset)."""
    if isinstance(exc, InferenceServerException) and exc.status():
        return f"{exc.status()} {(exc.message() or '')[:70]}"
    return type(exc).__name__


def measure(traffic: Traffic, name: str, fault: Callable[[], float | None], steady: bool = True) -> Outcome:
    """`fault()` returns when the faulted part is back (monotonic), or None where a replica serves
    on; then waits for the load to be served again and reads what happened. `steady`: only once
    the load is served (not when the fault is the remedy for an outage)."""
    if steady:
        wait_until(lambda: traffic.successes_since(time.monotonic() - 5) > 20, 120, f"steady load before {name}", 0.2)
    begun = time.monotonic()
    back = fault()
    reference = begun if back is None else back
    wait_until(lambda: traffic.successes_since(reference) > 100, 180, f"served again after {name}", 0.2)
    seen = traffic.around(begun)
    next_success = min(end for _, end, ok, _ in seen if ok and end >= reference) - reference
    outcome = Outcome(
        name,
        len(seen),
        collections.Counter(error for _, _, ok, error in seen if not ok),
        max(end - started for started, end, *_ in seen),
        max(0.0, next_success),
        "fault" if back is None else "return",
    )
    print(outcome.row(), flush=True)
    return outcome


def crash_and_return(project: Project, service: str) -> Callable[[], float]:
    """SIGKILL the service's oldest container; returns when its restart policy has it running again."""

    def fault() -> float:
        container = project.containers(service)[0]
        before = project.restarts(container)
        project.crash(container)
        wait_until(
            lambda: project.restarts(container) > before and project.inspect(container)["State"]["Running"],
            120,
            f"{service} restarted",
            0.1,
        )
        return time.monotonic()

    return fault


def crash(project: Project, service: str) -> Callable[[], None]:
    """SIGKILL where another replica serves on: the reference is the fault itself."""

    def fault() -> None:
        crash_and_return(project, service)()

    return fault


def partition(project: Project, worker: str) -> Callable[[], None]:
    """The worker's container off the project's network for `PARTITION_S`, then back on it."""
    network = f"{project.name}_default"

    def fault() -> None:
        run(["docker", "network", "disconnect", network, worker])
        cut = threading.Event()
        cut.wait(PARTITION_S)  # the fault's length, not a synchronisation
        run(["docker", "network", "connect", network, worker])

    return fault


def restart_all(project: Project) -> Callable[[], float]:
    def fault() -> float:
        project.compose("restart", timeout=600)
        return time.monotonic()

    return fault


def bound_for(fault: str) -> float:
    """The scheduler's bound where it restarts: killed, or stopped with the rest of the project (its
    leases outlive it there too, when nats-server stops before it can give them back)."""
    restarts_the_scheduler = fault.startswith("scheduler") or fault == "docker compose restart"
    return SCHEDULER_NEXT_SUCCESS_S if restarts_the_scheduler else NEXT_SUCCESS_S


def rejoins(project: Project, worker: str) -> None:
    """The worker (its hostname) comes back on its own and takes batches again."""
    before = executions(project).get(worker, 0)
    wait_until(lambda: executions(project).get(worker, 0) > before, 120, "the cut-off worker serving", 0.5, STARTING)


def test_every_container_kind_killed_a_partition_and_a_restart_under_load(project):
    stack = project("docker-compose.yml", "docker-compose.nats-cluster.yml")
    stack.up("--scale", "worker=2")
    wait_ready(stack)
    workers = stack.containers("worker")
    names = {hostname(stack, w) for w in workers}
    wait_until(lambda: set(executions(stack)) >= names, 120, "both workers on the bus", 0.5, STARTING)
    faults: list[tuple[str, Callable[[], float | None]]] = [
        ("worker killed (another serves on)", crash(stack, "worker")),
        ("gateway killed", crash_and_return(stack, "gateway")),
        ("scheduler killed", crash_and_return(stack, "scheduler")),
        ("repository killed", crash_and_return(stack, "repository")),
        ("NATS node 1 killed", crash(stack, "nats")),
        ("NATS node 2 killed", crash(stack, "nats-2")),
        ("NATS node 3 killed", crash(stack, "nats-3")),
        (f"a worker off the network for {PARTITION_S:.0f} s", partition(stack, workers[-1])),
        ("docker compose restart", restart_all(stack)),
    ]
    print("\n| fault | requests | failed | slowest | next success |\n|---|---|---|---|---|")
    outcomes = []
    with Traffic(stack) as traffic:
        for name, fault in faults:
            outcomes.append(measure(traffic, name, fault))
            if name.startswith("a worker off"):
                rejoins(stack, hostname(stack, workers[-1]))
    late = [o for o in outcomes if o.next_success_s > bound_for(o.fault) or o.slowest_s > SLOWEST_S]
    assert not late, "\n".join(o.row() for o in late) + "\n" + stack.logs(tail=200)


def fill_store(project: Project, hold_s: float = 10.0) -> Callable[[], float]:
    """NATS's store volume filled to the last byte for `hold_s`, then emptied again; returns when
    the space is back."""

    def fault() -> float:
        node = project.containers("nats")[0]
        filled = project.exec(node, "sh", "-c", "dd if=/dev/zero of=/data/fill bs=1M 2>&1; df -k /data", check=False)
        print(filled.strip().splitlines()[-1], flush=True)
        threading.Event().wait(hold_s)  # the fault's length, not a synchronisation
        project.exec(node, "sh", "-c", ": > /data/fill")  # emptied by the shell: the image may have no rm
        return time.monotonic()

    return fault


def test_a_full_nats_store_under_load(project):
    """The store's volume full for 10 s. nats-server stops writing to a stream that met a write
    error until it restarts (its filestore's rule): the test shows what serving does meanwhile,
    then restarts the node, as an operator (or an orchestrator's health probe) would."""
    stack = project("docker-compose.yml", "tests/deploy/small-store.yml")
    stack.up()
    wait_ready(stack)
    print("\n| fault | requests | failed | slowest | next success |\n|---|---|---|---|---|")
    with Traffic(stack) as traffic:
        measure(traffic, "the NATS store's volume full for 10 s", fill_store(stack))
        begun = time.monotonic()
        wait_s(30)
        after_space = traffic.around(begun)
        failed = collections.Counter(error for _, _, ok, error in after_space if not ok)
        print(f"| the 30 s after the space came back | {len(after_space)} | {dict(failed)} | |", flush=True)
        print(f"JetStream healthy 30 s after the space came back: {store_healthy(stack)}", flush=True)
        try:
            restarted = measure(traffic, "then the NATS node restarted", restart(stack, "nats"), steady=False)
            wait_until(lambda: store_healthy(stack), 60, "JetStream healthy after the restart", 1.0)
        except AssertionError:
            print(stack.logs(tail=150))
            raise
    slow = [r for r in traffic.results if r[1] - r[0] > SLOWEST_S]
    assert not slow, slow[:5]  # every request answered, served or refused, never left to its deadline
    assert restarted.next_success_s < NEXT_SUCCESS_S, restarted.row() + "\n" + stack.logs(tail=200)


def wait_s(seconds: float) -> None:
    """A stretch of the load with nothing done: what it shows is the point."""
    threading.Event().wait(seconds)


def restart(project: Project, service: str) -> Callable[[], float]:
    """`docker restart` of the service's container; returns when it runs again."""

    def fault() -> float:
        run(["docker", "restart", "-t", "10", project.containers(service)[0]], timeout=120)
        return time.monotonic()

    return fault


def store_healthy(project: Project) -> bool:
    """nats-server's own health check, JetStream's streams included."""
    node = project.containers("nats")[0]
    answer = project.exec(node, "wget", "-qO-", "http://127.0.0.1:8222/healthz", check=False)
    return '"ok"' in answer
