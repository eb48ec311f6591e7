"""`shoal autoscale` on a Compose project, end to end (issue 45; docs/scaling.md, "Measured").

The real controller process (`shoal autoscale --compose-project`) reads the project's NATS as the
operator and scales its worker service through the Engine API while test clients step from 1 to 8
and back to 1 on a model of 50 ms a request. Checks: a worker added and serving after the queue
passed its target, the clients' p99 queue time back under the target while the 8 clients go on
(within the issue's 60 s), back to `--min` after the step, and no failed request over the whole
run (the workers scaled away drain first). Prints the figures docs/scaling.md quotes.

    python -m pytest -q -m deploy tests/deploy/test_compose_autoscale.py
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest

from services.repository import examples
from shoal.autoscale.policy import Policy
from tests.deploy.autoscaling import (
    Controller,
    Load,
    back_under,
    http,
    one_input,
    p99_windows,
    under_pressure,
    workers_serving,
    write_sleeper,
)
from tests.deploy.compose import Project
from tests.deploy.test_compose import READY_S, STARTING, served
from tests.serving import wait_until

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(1800)]

# 8 closed-loop clients on 50 ms workers: one worker keeps ~7 waiting (~350 ms), two ~6 (~150 ms),
# three ~5 (~85 ms): the step needs three to come back under 200 ms with room to spare
POLICY = Policy(min_replicas=1, max_replicas=3, target_queue_s=0.2, target_pending=2.0)
FLAGS = ["--min", "1", "--max", "3", "--target-queue-ms", "200", "--target-pending", "2", "--interval-s", "1"]
FLAGS += ["--up-cooldown-s", "5", "--down-cooldown-s", "10", "--target-utilization", "1.0"]
WINDOW_S = 5.0  # the p99 is taken over the requests started in each such window
HOLD = 4  # windows in a row under the target: the p99 is back, not passing by
P99_BACK_WITHIN_S = 60.0  # the bound, from the queue passing its target


def test_shoal_autoscale_follows_a_load_step_on_a_compose_project(project, tmp_path: Path):
    models = tmp_path / "models"
    examples.write_examples(models)
    write_sleeper(models)
    os.chmod(tmp_path, 0o755)  # the repository's user reads the models
    deployment: Project = project(env={"SHOAL_MODELS": str(models)})
    deployment.up()
    sleeper = one_input("sleeper")
    client = http(deployment)
    try:
        ready = wait_until(
            lambda: client.is_server_ready() and served(client) and sleeper(client),
            READY_S,
            "the project ready and serving",
            0.5,
            STARTING,
            detail=lambda: deployment.logs(),
        )
    finally:
        client.close()
    print(f"project ready in {ready:.0f}s")
    controller = Controller(deployment, ["--compose-project", deployment.name], FLAGS)
    looks = controller.looks
    load = Load(deployment, sleeper)
    try:
        load.clients(1)
        wait_until(lambda: load.ok_since(0) > 40 and len(looks) > 3, 120, "one client, and the controller looking")
        assert all(look["desired"] == 1 for look in looks), looks[-3:]  # one client: no pressure
        floor = statistics.median(ended - started for started, ended, *_ in load.results[10:])
        first = set(workers_serving(deployment, "sleeper"))
        step_wall, step = time.time(), time.monotonic()
        load.clients(8)

        def added_serving() -> bool:
            return any(n > 0 for w, n in workers_serving(deployment, "sleeper").items() if w not in first)

        wait_until(added_serving, 180, "an added worker serving", 0.25, detail=lambda: looks[-3:])
        serving_at = time.time()

        def p99_back() -> bool:
            windows = p99_windows(load.results, step, time.monotonic() - 2, floor, WINDOW_S)
            return back_under(windows, POLICY.target_queue_s, HOLD) is not None

        wait_until(p99_back, 240, "the p99 queue time back under its target", 1.0, detail=lambda: looks[-3:])
        step_end = time.monotonic()
        load.clients(1)
        down_from = time.monotonic()
        wait_until(
            lambda: len(deployment.containers("worker")) == 1 and looks[-1]["replicas"] == 1,
            300,
            "scaled back down to one worker",
            1.0,
            detail=lambda: looks[-3:],
        )
        down_s = time.monotonic() - down_from
        ended = time.monotonic()
        wait_until(lambda: load.ok_since(ended) > 20, 60, "serving on after the scale-down")
    finally:
        load.clients(0)
        controller.stop()
    passed = next(look["time"] for look in looks if look["time"] > step_wall and under_pressure(POLICY, look))
    windows = p99_windows(load.results, step, step_end, floor, WINDOW_S)
    back = back_under(windows, POLICY.target_queue_s, HOLD)
    assert back is not None and back > 0, windows  # over the target after the step, then back under
    back_s = back * WINDOW_S  # from the step
    failures = load.failures()
    print(
        f"compose load step 1 -> 8 clients (one client alone: {floor * 1000:.0f} ms a request): queue past its "
        f"target {passed - step_wall:.1f}s after the step; an added worker served {serving_at - passed:.1f}s after "
        f"that; desired up to {max(look['desired'] for look in looks)}; p99 queue time back under "
        f"{POLICY.target_queue_s * 1000:.0f} ms {back_s:.0f}s after the step ({back_s - (passed - step_wall):.0f}s "
        f"after the queue passed it); p99 per {WINDOW_S:g}s window (ms): {[round(w * 1000) for w in windows]}"
    )
    print(f"back to one worker {down_s:.0f}s after the step ended")
    slowest = max(ended - started for started, ended, *_ in load.results)
    print(
        f"compose autoscaling: {len(load.results)} requests, {len(failures)} failed {failures[:3]}, "
        f"slowest {slowest:.2f}s"
    )
    assert not failures
    assert back_s - (passed - step_wall) <= P99_BACK_WITHIN_S, windows
