"""A busy machine kills nothing: python models load and serve with every core saturated by other
processes, and no model that became READY is ever UNAVAILABLE again (issue 33: on two cores at load
10-14, python children that had just loaded missed their heartbeats, were declared gone 3.5 s later
and their models flapped between UNAVAILABLE and READY).

Two ways: the machine saturated by CPU burners while many python models load (what happened;
how long a process waits for a core then depends on the machine), and the extreme of it made exact:
each model's process gets no CPU at all for twice the heartbeat timeout (SIGSTOP, then SIGCONT),
with its NATS connection alive throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from services.worker.python.processes.child_startup import process_name
from shared.process.natsserver import NatsServer
from tests.cluster import running_cluster
from tests.integration.model_states import StateLog
from tests.serving import wait_until

MODELS = int(os.environ.get("BUSY_MODELS", "12"))
LOAD_S = 240.0  # the models' processes start on cores that other processes keep busy
WATCH_S = 15.0  # how long the models are watched, loaded and idle, with the cores still saturated
BURNERS_PER_CORE = 3

MODEL_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        sum(i * i for i in range(2_000_000))  # a model that takes a moment of CPU to load

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() + 1)])
            for r in requests]
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""


@pytest.fixture
def saturated() -> Iterator[None]:
    """Every core busy with processes that never yield, more of them than cores (load ~ 3 per core)."""
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(BURNERS_PER_CORE * (os.cpu_count() or 1))
    ]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()


def write_models(root: Path, count: int) -> list[str]:
    names = [f"busy_{i}" for i in range(count)]
    for name in names:
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(textwrap.dedent(MODEL_PY))
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    return names


@pytest.mark.timeout(LOAD_S + WATCH_S + 120)
def test_python_models_load_and_stay_ready_on_a_saturated_machine(tmp_path, saturated):
    names = write_models(tmp_path, MODELS)
    with (
        NatsServer() as nats_server,
        StateLog(nats_server.url) as log,  # from before the first load
        running_cluster(tmp_path, nats_server=nats_server, ready_timeout_s=LOAD_S) as running,
    ):
        client = httpclient.InferenceServerClient(running.url, network_timeout=120)
        # the watch catches up with the bucket
        wait_until(
            lambda: all(log.states.get(f"{n}/1", [""])[-1] == "READY" for n in names),
            30,
            "READY",
            0.2,
            detail=lambda: log.states,
        )
        watched = time.monotonic()
        while time.monotonic() - watched < WATCH_S:  # loaded and idle, on the still saturated cores
            assert not log.flapped(), log.states
            time.sleep(0.2)
        for name in names:
            tensor = httpclient.InferInput("INPUT0", [4], "FP32")
            tensor.set_data_from_numpy(np.zeros(4, np.float32))
            np.testing.assert_array_equal(client.infer(name, [tensor]).as_numpy("OUTPUT0"), np.ones(4, np.float32))
        client.close()
        assert not log.flapped(), log.states


def processes_of(models: list[str]) -> list[int]:
    """The pids of these python models' own processes (each names itself `py<i>:<model>`)."""
    names = {process_name(m, i)[:15] for m in models for i in (-1, 0)}
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() in names:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_model_process_without_cpu_for_longer_than_the_heartbeat_timeout_stays_ready(tmp_path):
    names = write_models(tmp_path, 2)
    timeout_s = 3.0  # the repository's and the scheduler's heartbeat timeout in tests/cluster.py
    with (
        NatsServer() as nats_server,
        StateLog(nats_server.url) as log,
        running_cluster(tmp_path, nats_server=nats_server) as running,
    ):
        wait_until(
            lambda: all(log.states.get(f"{n}/1", [""])[-1] == "READY" for n in names),
            30,
            "READY",
            detail=lambda: log.states,
        )
        pids = processes_of(names)
        assert len(pids) == len(names), pids
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(2 * timeout_s)  # the pause itself is the point: no heartbeat, no answer
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        client = httpclient.InferenceServerClient(running.url, network_timeout=60)
        for name in names:
            tensor = httpclient.InferInput("INPUT0", [4], "FP32")
            tensor.set_data_from_numpy(np.zeros(4, np.float32))
            np.testing.assert_array_equal(client.infer(name, [tensor]).as_numpy("OUTPUT0"), np.ones(4, np.float32))
        client.close()
        assert not log.flapped(), log.states
