"""`docker stack deploy` of docker-compose.swarm.yml on a single-node swarm, for real (issue 45 item 4).

Joins this engine to a swarm of its own (`docker swarm init`) and leaves it afterwards; skips where
the engine is in a swarm already (someone else's: never left by us) or cannot run the stack. Marked
`deploy` (left out of the default run): python -m pytest -q -m deploy tests/deploy/test_swarm.py

What it checks: the stack serves through tritonclient with the replicas asked for; a rolling
update of the worker service under load fails no request (start-first, and the old task drains on
SIGTERM); a worker task SIGKILLed under load costs at most one request and Swarm replaces it; and
`shoal autoscale` scales the worker service up under a load step (1 -> 8 clients) and back down
after it, with no failed request, and (`--min 0`, on demand) to zero when idle and back to one
for the next request. It prints the time from the queue passing its target to the
added worker serving (docs/scaling.md quotes it).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from services.repository import examples
from shoal.autoscale.policy import Policy
from tests.deploy.autoscaling import Controller, Load, http, one_input, under_pressure, workers_serving
from tests.deploy.compose import Project, compose_command, engine_refused, run
from tests.deploy.swarm import Stack, swarm_state
from tests.deploy.test_compose import FAIL_WITHIN_S, READY_S, STARTING, check_fault, served
from tests.integration.slow_model import slow_graph
from tests.integration.test_scheduling_policies import config
from tests.serving import wait_until

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(2400)]

TARGET_QUEUE_MS = 150.0
# 8 closed-loop clients on one single-request instance keep ~7 requests waiting whatever the
# machine's speed; the queue's wait (7 x the service time) passed 150 ms here but not on CI's
# faster cores (~80 ms), so the pending signal is what makes the step pressure everywhere
TARGET_PENDING = 3.0


POLICY = Policy(target_queue_s=TARGET_QUEUE_MS / 1000, target_pending=TARGET_PENDING)


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    refused = engine_refused()
    if refused:
        pytest.skip(refused)
    if swarm_state() != "inactive":
        pytest.skip(f"this engine is in a swarm already ({swarm_state()}): not ours to join or leave")
    command = compose_command()
    assert command is not None
    tag = f"shoal-swarm-test-{uuid.uuid4().hex[:8]}:cpu"
    started = time.monotonic()
    Project(command, tag).compose("build", timeout=1800)
    print(f"built {tag} in {time.monotonic() - started:.0f}s")
    yield tag
    run(["docker", "image", "rm", "-f", tag], check=False)


@pytest.fixture(scope="module")
def swarm(image: str) -> Iterator[str]:
    run(["docker", "swarm", "init", "--advertise-addr", "127.0.0.1"], timeout=120)
    try:
        yield image
    finally:
        run(["docker", "swarm", "leave", "--force"], timeout=120)


@pytest.fixture
def stack(swarm: str, tmp_path: Path) -> Iterator[Stack]:
    """A stack whose repository holds the example models and `slow` (one instance, ~40 ms a request)."""
    models = tmp_path / "models"
    examples.write_examples(models)
    examples.write_model(models, "slow", slow_graph(768), config("slow", ""))
    os.chmod(tmp_path, 0o755)
    made = Stack(swarm, {"SHOAL_MODELS": str(models)})
    try:
        yield made
    finally:
        try:
            made.remove()
        finally:
            left = made.leftovers()
        assert not left, f"`docker stack rm` left {left}"


def slow(client: httpclient.InferenceServerClient) -> bool:
    return one_input("slow")(client)


def wait_ready(stack: Stack) -> float:
    client = http(stack)
    try:
        return wait_until(
            lambda: client.is_server_ready() and served(client) and slow(client),
            READY_S,
            "the stack ready and serving",
            0.5,
            STARTING,
            detail=lambda: stack.logs("gateway")[-2000:] + stack.logs("worker")[-2000:],
        )
    finally:
        client.close()


def test_swarm_replicas_rolling_update_and_a_killed_worker(stack: Stack):
    stack.env["SHOAL_WORKERS"] = "2"
    stack.deploy()
    print(f"stack ready in {wait_ready(stack):.0f}s")
    wait_until(lambda: len(stack.containers("worker")) == 2, 120, "two worker tasks running", 0.5)
    wait_until(lambda: len(workers_serving(stack, "simple")) == 2, 120, "both workers hosting simple", 0.5)

    load = Load(stack, served)
    load.clients(4)
    try:
        wait_until(lambda: load.ok_since(0) > 50, 60, "load before the update", 0.1, STARTING)
        before = set(stack.containers("worker"))
        started = time.monotonic()
        run(["docker", "service", "update", "--force", stack.service("worker")], timeout=600)  # waits till converged
        print(f"rolling update of 2 workers under load: {time.monotonic() - started:.0f}s")
        after = set(stack.containers("worker"))
        assert len(after) == 2 and not after & before, (before, after)
        done = time.monotonic()
        wait_until(lambda: load.ok_since(done) > 100, 120, "load after the update", 0.1)
    finally:
        load.clients(0)
    failures = load.failures()
    print(f"rolling update: {len(load.results)} requests, {len(failures)} failed {failures[:3]}")
    assert not failures

    load = Load(stack, served)
    load.clients(4)
    try:
        wait_until(lambda: load.ok_since(0) > 50, 60, "load before the kill", 0.1, STARTING)
        victim = stack.containers("worker")[0]
        os.kill(int(stack.inspect(victim)["State"]["Pid"]), signal.SIGKILL)  # a crash, not a stop
        done = time.monotonic()
        wait_until(lambda: load.ok_since(done) > 150, 120, "load after the kill", 0.1)
        wait_until(
            lambda: len(stack.containers("worker")) == 2 and victim not in stack.containers("worker"),
            120,
            "swarm replacing the killed worker",
            0.5,
        )
    finally:
        load.clients(0)
    check_fault(load.results, "worker task SIGKILLed")


def test_shoal_autoscale_scales_the_swarm_service_up_under_a_load_step_and_down_after(stack: Stack):
    stack.env["SHOAL_WORKERS"] = "1"
    stack.deploy()
    print(f"stack ready in {wait_ready(stack):.0f}s")
    flags = ["--min", "1", "--max", "3", "--target-queue-ms", str(TARGET_QUEUE_MS), "--interval-s", "1"]
    flags += ["--target-pending", str(TARGET_PENDING)]
    flags += ["--up-cooldown-s", "5", "--down-cooldown-s", "10", "--target-utilization", "1.0"]
    controller = Controller(stack, ["--swarm-service", stack.service("worker")], flags)
    looks = controller.looks
    load = Load(stack, slow)
    try:
        load.clients(1)
        wait_until(lambda: load.ok_since(0) > 20 and len(looks) > 3, 120, "one client, and the controller looking")
        assert all(look["desired"] == 1 for look in looks), looks[-3:]  # one client: no pressure
        first = set(workers_serving(stack, "slow"))
        step = time.time()
        load.clients(8)

        def added_serving() -> float | None:
            more = {w: n for w, n in workers_serving(stack, "slow").items() if w not in first and n > 0}
            return time.time() if more else None

        wait_until(added_serving, 180, "an added worker serving", 0.25, detail=lambda: looks[-3:])
        serving_at = time.time()
        passed = next(look["time"] for look in looks if look["time"] > step and under_pressure(POLICY, look))
        scaled = max(look["desired"] for look in looks)
        print(
            f"load step 1 -> 8 clients: queue past a target {passed - step:.1f}s after the step; an added worker "
            f"served {serving_at - passed:.1f}s after that; desired up to {scaled}"
        )
        assert stack.replicas("worker") >= 2
        calm = time.monotonic()
        wait_until(lambda: load.ok_since(calm) > 100, 120, "the load step served")
        down_from = time.time()
        load.clients(1)
        wait_until(
            lambda: stack.replicas("worker") == 1 and len(stack.containers("worker")) == 1,
            300,
            "scaled back down to one worker",
            1.0,
            detail=lambda: looks[-3:],
        )
        print(f"back to one worker {time.time() - down_from:.0f}s after the step ended")
        ended = time.monotonic()
        wait_until(lambda: load.ok_since(ended) > 20, 60, "serving on after the scale-down")
    finally:
        load.clients(0)
        controller.stop()
    failures = load.failures()
    slowest = max(end - started for started, end, *_ in load.results)
    print(f"autoscaling: {len(load.results)} requests, {len(failures)} failed {failures[:3]}, slowest {slowest:.2f}s")
    assert not failures
    assert slowest < 10 * FAIL_WITHIN_S


def test_shoal_autoscale_takes_the_swarm_service_to_zero_and_the_next_request_back(stack: Stack):
    """`--min 0` (docs/scaling.md, rule 5): idle for the window, the worker service goes to zero
    replicas (the worker drains and stops); the next request waits in the repository for an
    on-demand load (its `demand_loads`), the controller starts a worker, and the request is served."""
    stack.env.update(SHOAL_WORKERS="1", SHOAL_MODEL_CONTROL_MODE="on-demand")
    stack.deploy()
    print(f"stack ready in {wait_ready(stack):.0f}s")
    flags = ["--min", "0", "--max", "2", "--idle-window-s", "10", "--down-cooldown-s", "5", "--interval-s", "1"]
    controller = Controller(stack, ["--swarm-service", stack.service("worker")], flags)
    looks = controller.looks
    client = httpclient.InferenceServerClient(stack.url, network_timeout=120)
    try:
        idle = time.monotonic()
        wait_until(
            lambda: stack.replicas("worker") == 0 and not stack.containers("worker"),
            180,
            "the worker service at zero, its task gone",
            0.5,
            detail=lambda: looks[-3:],
        )
        print(f"to zero {time.monotonic() - idle:.0f}s after the last request (idle window 10 s)")
        asked = time.time()
        assert slow(client)  # waits for the worker the controller starts, and its on-demand load
        answered = time.time()
        woke = next(look for look in looks if look["time"] > asked and look["desired"] > 0)
        print(
            f"from zero: the controller saw the request {woke['time'] - asked:.1f}s after it was sent "
            f"(demand_loads {woke['loads']}); answered {answered - asked:.1f}s after it was sent"
        )
        assert woke["replicas"] == 0 and woke["reason"] == "a request came", woke
        assert stack.replicas("worker") == 1
    finally:
        client.close()
        controller.stop()


def test_shoal_autoscale_scales_a_compose_project_through_the_engine_api(image: str):
    """The Compose backend (shoal/autoscale/docker_backends.py) on docker-compose.yml: copies of the
    newest worker join and serve; the ones removed under load drain (no failed request); at zero the
    last is kept stopped and started again."""
    import docker

    from shoal.autoscale.docker_backends import ComposeService
    from tests.deploy.test_compose import wait_ready as compose_ready

    command = compose_command()
    assert command is not None
    project = Project(command, image)
    engine = docker.from_env()
    try:
        project.up()
        compose_ready(project)
        backend = ComposeService(engine, project.name, "worker")
        assert backend.replicas() == 1
        load = Load(project, served)
        load.clients(4)
        try:
            wait_until(lambda: load.ok_since(0) > 50, 60, "load before scaling", 0.1, STARTING)
            started = time.monotonic()
            backend.scale(3)
            wait_until(
                lambda: sum(n > 0 for n in workers_serving(project, "simple").values()) == 3, 180, "three serving", 0.5
            )
            print(f"compose: 1 -> 3 workers serving in {time.monotonic() - started:.1f}s")
            assert backend.replicas() == 3 and len(project.containers("worker")) == 3
            started = time.monotonic()
            backend.scale(1)  # returns once the two have drained and stopped
            print(f"compose: 3 -> 1 under load in {time.monotonic() - started:.1f}s")
            assert backend.replicas() == 1 and len(project.containers("worker", running_only=False)) == 1
            done = time.monotonic()
            wait_until(lambda: load.ok_since(done) > 100, 120, "load after the scale-down", 0.1)
        finally:
            load.clients(0)
        failures = load.failures()
        print(f"compose scaling: {len(load.results)} requests, {len(failures)} failed {failures[:3]}")
        assert not failures
        backend.scale(0)
        assert backend.replicas() == 0 and len(project.containers("worker", running_only=False)) == 1  # kept
        backend.scale(1)
        compose_ready(project)
    finally:
        try:
            project.down()
        finally:
            left = project.leftovers()
        assert not left, f"`down -v` left {left}"
