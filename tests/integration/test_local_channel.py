"""The local channel (docs/design.md §9), with the real services: a request whose gateway and worker
share a host crosses no nats-server; a worker killed mid-batch is answered within seconds; the
sockets are the user's alone and gone after a stop or a kill; `--local-channel=false` is NATS as
before."""

from __future__ import annotations

import glob
import json
import os
import signal
import stat
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.cluster import Running, build_test_repository, running_cluster
from tests.serving import wait_until

SLOW = """
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

RUNNING = Path(__file__).parent / "running"  # the test waits for it: the batch is in the model


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x.flat[0] > 0:
                RUNNING.touch()
                time.sleep(float(x.flat[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_test_repository(tmp_path_factory.mktemp("channel"))
    model = root / "slow_py"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(SLOW)
    (model / "config.pbtxt").write_text(
        'name: "slow_py"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    return root


def nats_messages(running: Running) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{running.nats.monitor_port}/varz", timeout=10) as answer:
        return int(json.load(answer)["in_msgs"])


def identity(client: httpclient.InferenceServerClient, n: int = 1) -> None:
    tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
    for _ in range(n):
        result = client.infer("identity_fp32", [tensor])
        assert result.as_numpy("OUTPUT0").tolist() == [list(range(16))]


def slow(client: httpclient.InferenceServerClient, seconds: float) -> np.ndarray:
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], np.float32))
    return client.infer("slow_py", [tensor]).as_numpy("OUTPUT0")


def messages_per_request(running: Running, requests: int = 200) -> float:
    with httpclient.InferenceServerClient(running.url) as client:
        identity(client, 20)  # the channel opens on the first batches
        before = nats_messages(running)
        identity(client, requests)
        return (nats_messages(running) - before) / requests


def channel_directories(pid: int) -> list[Path]:
    """The scratch directories (shared/process/scratch.py) a process made for its local channel:
    under its runtime directory (a `shoal-run` scratch directory, shoal/private_runtime.py) or /tmp."""
    found = []
    for owner in glob.glob("/tmp/shoal-channel*/.shoal-owner") + glob.glob("/tmp/*/shoal-channel*/.shoal-owner"):
        try:
            if int(Path(owner).read_text().split()[0]) == pid:
                found.append(Path(owner).parent)
        except (OSError, ValueError):
            continue
    return found


@pytest.fixture(scope="module")
def local(repository: Path) -> Running:
    """`shoal serve`'s shape: a scheduler in the gateway. The channel is on by default; CI's second
    pass turns it off (SHOAL_GATEWAY_LOCAL_CHANNEL=false, .ci/run), and then only the tests that
    need it skip."""
    with running_cluster(repository, shape="cohost") as running:
        yield running


@pytest.fixture
def channel_on(local: Running) -> Running:
    if not local.cluster.gateway.local_channel:
        pytest.skip("the local channel is turned off (SHOAL_GATEWAY_LOCAL_CHANNEL=false)")
    return local


def test_a_request_on_one_host_crosses_no_nats_server(channel_on):
    """2 messages per request over NATS (ExecBatch, BatchDone); none on the channel. Heartbeats and
    statistics still cross NATS meanwhile: a fraction of a message per request."""
    assert messages_per_request(channel_on) < 0.5


def test_with_the_channel_off_batches_cross_nats_as_before(repository):
    with running_cluster(repository, shape="cohost", local_channel=False, worker={"local_channel": False}) as running:
        assert messages_per_request(running) >= 1.9


def test_the_socket_is_the_users_alone(channel_on):
    worker = channel_on.cluster.child("worker-0").process.pid
    directories = channel_directories(worker)
    assert len(directories) == 1
    assert stat.S_IMODE(directories[0].stat().st_mode) == 0o700
    assert stat.S_IMODE((directories[0] / "worker.sock").stat().st_mode) == 0o600


def test_a_killed_worker_is_answered_within_seconds_and_leaves_no_socket(local):
    """A python model's instance process killed while it runs a batch that came by its channel:
    the client hears within seconds (not its 60 s timeout), the instance comes back and serves,
    and the dead process's socket directory is swept by the next one."""
    with httpclient.InferenceServerClient(local.url, network_timeout=60) as client:
        assert slow(client, 0).tolist() == [0]
        dead = next(p for p in _descendants(local.cluster.child("worker-0").process.pid) if _comm(p) == "py0:slow_py")
        left = channel_directories(dead)
        answered_s, outcome = killed_mid_batch(local, lambda: os.kill(dead, signal.SIGKILL))
        assert isinstance(outcome[0], InferenceServerException), outcome
        assert outcome[0].status() in ("500", "503"), outcome[0]
        assert answered_s < 3, f"the client waited {answered_s:.1f} s for a dead instance's answer"
        wait_until(lambda: _serves(client), 60, "the instance restarted and serves", 0.2)
        wait_until(lambda: not any(p.exists() for p in left), 30, "the dead instance's socket swept")


def killed_mid_batch(running: Running, kill: Callable[[], None]) -> tuple[float, list[object]]:
    """A 30 s call to `slow_py` killed (`kill`) once the model runs it: how long the client then
    waited, and what it got."""
    outcome: list[object] = []

    def call() -> None:  # a client of its own: tritonclient's HTTP client stays on its thread
        with httpclient.InferenceServerClient(running.url, network_timeout=60) as own:
            try:
                outcome.append(slow(own, 30))
            except InferenceServerException as exc:
                outcome.append(exc)

    marker = local_root(running) / "slow_py" / "1" / "running"
    marker.unlink(missing_ok=True)
    caller = threading.Thread(target=call)
    caller.start()
    wait_until(marker.exists, 20, "the model is running the batch", 0.02)
    killed = time.monotonic()
    kill()
    caller.join(40)
    return time.monotonic() - killed, outcome


def _descendants(pid: int) -> list[int]:
    out = []
    for path in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(path).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            child = int(path.split("/")[2])
            out += [child, *_descendants(child)]
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def local_root(running: Running) -> Path:
    return Path(running.cluster.repository.model_repository[0])


def _serves(client: httpclient.InferenceServerClient) -> bool:
    try:
        return slow(client, 0).tolist() == [0]
    except InferenceServerException:
        return False


def test_a_killed_worker_process_is_found_by_its_closed_channel(repository):
    """The worker itself killed mid-batch (the python model in its own process: no parent to report
    the exit): its channel closes, the gateway's scheduler asks NATS at once and fails the batch
    (WorkerLiveness.check), well before the heartbeat timeout."""
    with running_cluster(
        repository, shape="cohost", worker={"python_isolation": "none"}, scheduler={"worker_timeout_s": 30}
    ) as running:
        if not running.cluster.gateway.local_channel:
            pytest.skip("the local channel is turned off (SHOAL_GATEWAY_LOCAL_CHANNEL=false)")
        with httpclient.InferenceServerClient(running.url, network_timeout=60) as client:
            assert slow(client, 0).tolist() == [0]  # the channel is open from here on
            assert slow(client, 0).tolist() == [0]
        worker = running.cluster.child("worker-0").process.pid
        answered_s, outcome = killed_mid_batch(running, lambda: os.kill(worker, signal.SIGKILL))
        assert isinstance(outcome[0], InferenceServerException), outcome
        assert answered_s < 3, f"the client waited {answered_s:.1f} s; the heartbeat timeout is 30 s"
