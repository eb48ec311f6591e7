"""A python model's instances run as Triton runs them (`--python-isolation instance`, the default):
each in a process of its own, so `count: 2` runs two `execute` calls at once, each instance gets
Triton's `initialize` arguments, their custom metrics add up on `/metrics`, and one instance killed
fails only its own request while the other goes on serving and the model stays READY."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from services.worker.python.processes.child_startup import process_name
from shared.process.natsserver import NatsServer
from tests.cluster import running_cluster
from tests.integration.model_states import StateLog
from tests.serving import wait_until

MODEL_PY = """
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


def wait_for(condition, seconds):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        sum(i for i in range(20_000))  # pure Python: holds the GIL between looks
    return condition()


class TritonPythonModel:
    def initialize(self, args):
        self.args = {k: args[k] for k in ("model_instance_name", "model_instance_kind", "model_instance_device_id")}
        self.dir = Path(args["model_repository"])
        self.executed = pb_utils.MetricFamily("parallel_requests_total", "Requests this model ran",
                                              pb_utils.MetricFamily.COUNTER).Metric(labels={"model": "parallel"})

    def finalize(self):  # each instance's, in its own process
        (self.dir / "finalized").mkdir(exist_ok=True)
        (self.dir / "finalized" / f"{os.getpid()}-{self.args['model_instance_name']}").touch()

    def execute(self, requests):
        responses = []
        for request in requests:
            self.executed.increment(1)
            action = json.loads(request.parameters()).get("action", "")
            met = False
            if action == "meet":  # two executes at once: each waits for the other to arrive
                (self.dir / "meeting" / f"{os.getpid()}-{threading.get_ident()}").touch()
                met = wait_for(lambda: len(list((self.dir / "meeting").iterdir())) >= 2, 20)
            elif action == "hold":  # runs until the test releases it (or kills this process)
                (self.dir / "holding" / str(os.getpid())).touch()
                wait_for(lambda: (self.dir / "release").exists(), 60)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("PID", np.array([os.getpid()], np.int64)),
                pb_utils.Tensor("MET", np.array([met])),
                pb_utils.Tensor("ARGS", np.array([json.dumps(self.args).encode()], dtype=object)),
            ]))
        return responses
"""

CONFIG = """
name: "parallel"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }, { name: "MET" data_type: TYPE_BOOL dims: [ 1 ] },
         { name: "ARGS" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def instances(tmp_path_factory):
    root = tmp_path_factory.mktemp("python_instances")
    (root / "parallel" / "1").mkdir(parents=True)
    (root / "parallel" / "1" / "model.py").write_text(textwrap.dedent(MODEL_PY))
    (root / "parallel" / "config.pbtxt").write_text(CONFIG)
    for folder in ("meeting", "holding"):
        (root / "parallel" / folder).mkdir()
    with NatsServer() as nats_server, StateLog(nats_server.url) as log:
        with running_cluster(root, nats_server=nats_server) as running:
            running.root = root / "parallel"
            running.log = log
            yield running


def infer(url: str, action: str = "") -> dict:
    client = httpclient.InferenceServerClient(url, network_timeout=90)
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    try:
        result = client.infer("parallel", [tensor], parameters={"action": action} if action else None)
        return {
            "pid": int(result.as_numpy("PID")[0]),
            "met": bool(result.as_numpy("MET")[0]),
            "args": result.as_numpy("ARGS")[0].decode(),
        }
    finally:
        client.close()


def concurrently(url: str, action: str, n: int) -> list[dict | Exception]:
    answers: list[dict | Exception] = [RuntimeError("no answer")] * n

    def one(i: int) -> None:
        try:
            answers[i] = infer(url, action)
        except Exception as exc:
            answers[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return answers


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def instance_processes(model: str) -> dict[int, int]:
    """instance index -> pid of the model's instance processes: each names itself `py<i>:<model>`
    (/proc/PID/comm; a process forked from the zygote has the zygote's command line)."""
    found = {}
    names = {process_name(model, i)[:15]: i for i in range(8)}
    for entry in Path("/proc").iterdir():
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if entry.name.isdigit() and comm in names:
            found[names[comm]] = int(entry.name)
    return found


def test_each_instance_runs_in_its_own_process_and_two_executes_run_at_once(instances):
    for stale in (instances.root / "meeting").iterdir():
        stale.unlink()
    answers = concurrently(instances.url, "meet", 2)
    assert all(isinstance(a, dict) for a in answers), answers
    assert {a["pid"] for a in answers} == set(instance_processes("parallel").values())  # type: ignore[index]
    assert len({a["pid"] for a in answers}) == 2 and all(a["met"] for a in answers)  # type: ignore[index]
    args = sorted((json.loads(a["args"]) for a in answers), key=lambda a: a["model_instance_name"])  # type: ignore[index]
    # each process counted its own request: /metrics shows their sum (gathered with the heartbeats)
    wait_until(
        lambda: 'parallel_requests_total{model="parallel"} 2' in scrape(instances.metrics_url),
        15,
        "both processes' requests in /metrics",
        0.2,
        detail=lambda: [line for line in scrape(instances.metrics_url).splitlines() if "parallel_requests" in line],
    )
    assert args == [  # Triton names the group <model>_0 and its instances <group>_<i>
        {"model_instance_name": "parallel_0_0", "model_instance_kind": "CPU", "model_instance_device_id": "0"},
        {"model_instance_name": "parallel_0_1", "model_instance_kind": "CPU", "model_instance_device_id": "0"},
    ]


def test_each_instance_process_counts_in_the_models_memory(instances):
    """Each instance process reports its whole proportional set as its instance's memory; the index
    shows their sum (what the on-demand budget counts too)."""
    reports = [r for r in instances.log.reports.values() if r.model == "parallel" and r.serving_generation]
    assert len(reports) == 2 and all(r.rss_bytes > 10 << 20 for r in reports), reports  # a process each
    client = httpclient.InferenceServerClient(instances.url)
    (entry,) = [m for m in client.get_model_repository_index() if m["name"] == "parallel"]
    client.close()
    assert int(entry["memory_bytes"]) == sum(r.rss_bytes for r in reports), entry


def test_one_instance_killed_fails_only_its_request_and_the_other_serves_on(instances):
    before = instance_processes("parallel")
    assert sorted(before) == [0, 1], before
    holding = instances.root / "holding"
    for stale in holding.iterdir():
        stale.unlink()
    held: list[dict | Exception] = []
    holder = threading.Thread(target=lambda: held.extend(concurrently(instances.url, "hold", 1)))
    holder.start()
    wait_until(lambda: list(holding.iterdir()), 30, "the held request starting", 0.05)
    victim = int(next(holding.iterdir()).name)
    survivor = next(pid for pid in before.values() if pid != victim)
    os.kill(victim, signal.SIGKILL)
    holder.join(60)
    assert isinstance(held[0], InferenceServerException), held
    assert held[0].status() == "503" and "stopped responding" in held[0].message(), held[0].message()
    served = [infer(instances.url)["pid"] for _ in range(10)]  # while the killed one starts again
    assert set(served) == {survivor}, served
    wait_until(  # the killed instance comes back in a process of its own, loaded, beside the other
        lambda: len(instances.log.serving("parallel")) == 2 and sorted(instance_processes("parallel")) == [0, 1],
        60,
        "the killed instance back",
        detail=lambda: (instances.log.serving("parallel"), instance_processes("parallel")),
    )
    now = instance_processes("parallel")
    assert victim not in now.values() and survivor in now.values(), now
    for stale in (instances.root / "meeting").iterdir():
        stale.unlink()
    answers = concurrently(instances.url, "meet", 2)  # both serve again, at once
    assert all(isinstance(a, dict) and a["met"] for a in answers), answers
    assert {a["pid"] for a in answers} == set(now.values())  # type: ignore[index]
    assert "READY" in instances.log.states["parallel/1"] and not instances.log.flapped(), instances.log.states


def test_isolation_model_runs_the_instances_as_threads_of_one_process(tmp_path):
    """`--python-isolation model`: one process for the model, its two instances threads of it."""
    (tmp_path / "parallel" / "1").mkdir(parents=True)
    (tmp_path / "parallel" / "1" / "model.py").write_text(textwrap.dedent(MODEL_PY))
    (tmp_path / "parallel" / "config.pbtxt").write_text(CONFIG)
    (tmp_path / "parallel" / "meeting").mkdir()
    with running_cluster(tmp_path, worker={"python_isolation": "model"}) as running:
        answers = concurrently(running.url, "meet", 2)
        assert all(isinstance(a, dict) and a["met"] for a in answers), answers
        (pid,) = {a["pid"] for a in answers}  # type: ignore[index]
        assert Path(f"/proc/{pid}/comm").read_text().strip() == process_name("parallel", -1)  # the whole model's
        names = {json.loads(a["args"])["model_instance_name"] for a in answers}  # type: ignore[index]
        assert names == {"parallel_0_0", "parallel_0_1"}


PICKY_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        if args["model_instance_name"].endswith("_1"):
            raise ValueError("instance 1 refuses to start")

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("PID", np.array([0], np.int64)), pb_utils.Tensor("MET", np.array([False])),
            pb_utils.Tensor("ARGS", np.array([b"{}"], dtype=object))]) for _ in requests]
"""


def test_instances_come_and_go_with_the_count_and_one_failing_fails_the_load(tmp_path):
    """A reload to count 3 starts a third process, to count 1 stops two; the model stays READY and
    each load answers once every instance has loaded. An instance whose `initialize` raises fails
    the whole load with its reason, as in Triton."""
    (tmp_path / "counted" / "1").mkdir(parents=True)  # a name of its own: the module's cluster runs "parallel"
    (tmp_path / "counted" / "1" / "model.py").write_text(textwrap.dedent(MODEL_PY))
    (tmp_path / "counted" / "config.pbtxt").write_text(CONFIG.replace('"parallel"', '"counted"'))
    (tmp_path / "picky" / "1").mkdir(parents=True)
    (tmp_path / "picky" / "1" / "model.py").write_text(textwrap.dedent(PICKY_PY))
    (tmp_path / "picky" / "config.pbtxt").write_text(CONFIG.replace('"parallel"', '"picky"'))
    explicit = {"model_control_mode": "explicit", "load_model": ["counted"]}
    with NatsServer() as nats_server, StateLog(nats_server.url) as log:
        with running_cluster(tmp_path, nats_server=nats_server, repository=explicit) as running:
            client = httpclient.InferenceServerClient(running.url, network_timeout=120)
            config = client.get_model_config("counted")
            processes: dict[int, int] = {}
            for count in (3, 1):
                config["instance_group"][0]["count"] = count
                client.load_model("counted", config=json.dumps(config))  # answers once all have loaded
                wait_until(
                    lambda n=count: len(log.serving("counted")) == n, 30, "instances serving", detail=lambda: log.states
                )
                wait_until(
                    lambda n=count: len(instance_processes("counted")) == n,
                    30,
                    "instance processes",
                    detail=lambda: instance_processes("counted"),
                )
                tensor = httpclient.InferInput("INPUT0", [1], "FP32")
                tensor.set_data_from_numpy(np.zeros(1, np.float32))
                pid = int(client.infer("counted", [tensor]).as_numpy("PID")[0])
                assert pid in instance_processes("counted").values()
                processes = {**processes, **instance_processes("counted")}
            assert not log.flapped(), log.states
            stopped = {str(processes[1]), str(processes[2])}  # instances 1 and 2, gone with the count

            def finalized() -> set[str]:
                return {name.name.split("-")[0] for name in (tmp_path / "counted" / "finalized").iterdir()}

            wait_until(lambda: stopped <= finalized(), 30, "instances 1 and 2 finalized", detail=finalized)
            with pytest.raises(InferenceServerException) as err:
                client.load_model("picky")
            assert "instance 1 refuses to start" in err.value.message(), err.value.message()
            assert not client.is_model_ready("picky")
            client.close()
