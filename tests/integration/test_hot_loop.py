"""The hot loop of a python model's instance process (docs/design.md §9): a batch that comes by the
local channel runs on the channel's own thread, and answers as the event loop's path does. Two
clusters side by side on one repository: `shoal serve`'s shape (the local channel, so the hot loop)
and the channel off (every batch over NATS, through the event loop and the instance's thread); the
same requests get the same answers, errors, deadline outcomes and crash outcomes from both, and the
worker's status counts what the hot loop ran."""

from __future__ import annotations

import asyncio
import queue
import re
import textwrap
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from shoal import topology
from tests.cluster import Running, running_cluster
from tests.serving import wait_until

MODEL_PY = """
import json
import os
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            action = json.loads(request.parameters()).get("action", "")
            if action == "raise":
                raise ValueError("asked to raise")
            if action == "crash":
                (Path(__file__).parent / "crashing").touch()
                os._exit(3)
            if action == "error":
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("asked to fail", pb_utils.TritonError.INVALID_ARG)))
                continue
            if action == "grow":  # an output too big to travel inline: the tensor store's
                x = np.tile(x, 65536)
            if action == "wait_cancel":  # runs until its client gives up on it
                tag = json.loads(request.parameters())["tag"]
                (Path(__file__).parent / f"running-{tag}").touch()
                deadline = time.monotonic() + 20
                while not request.is_cancelled() and time.monotonic() < deadline:
                    time.sleep(0.01)
                if request.is_cancelled():
                    (Path(__file__).parent / f"cancelled-{tag}").touch()
            late = False
            if action == "outlive":  # runs past its deadline: the model sees it as cancelled
                deadline = time.monotonic() + 10
                while not request.is_cancelled() and time.monotonic() < deadline:
                    time.sleep(0.01)
                late = request.is_cancelled()
                time.sleep(2)  # well past it: the gateway's own deadline answers first, whichever road
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", x * 2),
                pb_utils.Tensor("LATE", np.array([late])),
            ]))
        return responses
"""

CONFIG = """
name: "hot"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "LATE" data_type: TYPE_BOOL dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


DEADLINE_S = 5.0  # the gateways' deadline for a request (`request_timeout_s`)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hot_loop")
    (root / "hot" / "1").mkdir(parents=True)
    (root / "hot" / "1" / "model.py").write_text(textwrap.dedent(MODEL_PY))
    (root / "hot" / "config.pbtxt").write_text(CONFIG)
    return root


@pytest.fixture(scope="module")
def hot(repository: Path) -> Iterator[Running]:
    with running_cluster(repository, shape="cohost", request_timeout_s=DEADLINE_S) as running:
        if not running.cluster.gateway.local_channel:
            pytest.skip("the local channel is turned off (SHOAL_GATEWAY_LOCAL_CHANNEL=false)")
        yield running


@pytest.fixture(scope="module")
def nats(repository: Path) -> Iterator[Running]:
    with running_cluster(
        repository, shape="cohost", local_channel=False, worker={"local_channel": False}, request_timeout_s=DEADLINE_S
    ) as running:
        yield running


def call(running: Running, action: str = "", size: int = 4) -> tuple[str, object]:
    """("ok", outputs) or (HTTP status, message) for one request."""
    tensor = httpclient.InferInput("INPUT0", [size], "FP32")
    tensor.set_data_from_numpy(np.arange(size, dtype=np.float32))
    with httpclient.InferenceServerClient(running.url, network_timeout=60) as client:
        try:
            result = client.infer("hot", [tensor], parameters={"action": action} if action else None)
        except InferenceServerException as exc:
            return str(exc.status()), exc.message()
        return "ok", (result.as_numpy("OUTPUT0").tolist(), result.as_numpy("LATE").tolist())


def model_workers(running: Running) -> list[dict]:
    """The status of every worker that hosts `hot` (its instance process)."""
    services = asyncio.run(topology.collect(running.nats.url, wait=0.3))
    return [
        s["status"]
        for s in services
        if s["name"] == "shoal-worker" and any(k.startswith("hot/") for k in s.get("status", {}).get("models", {}))
    ]


def hot_loop_batches(running: Running) -> int:
    return sum(status.get("batches_hot_loop", 0) for status in model_workers(running))


def channel_batches(running: Running) -> int:
    return sum(status.get("batches_over_channel", 0) for status in model_workers(running))


def test_the_instance_process_runs_channel_batches_on_its_hot_loop(hot, nats):
    assert call(hot) == ("ok", ([0, 2, 4, 6], [False]))  # the channel opens on the first batches
    before = hot_loop_batches(hot)
    for _ in range(20):
        assert call(hot) == ("ok", ([0, 2, 4, 6], [False]))
    assert hot_loop_batches(hot) >= before + 20
    statuses = model_workers(hot)
    assert sum(s["batches_over_channel"] for s in statuses) >= 20  # still counted as the channel's
    assert sum(i["executions"] for s in statuses for m in s["models"].values() for i in m["instance_list"]) >= 21
    # over NATS the event loop's path runs them, as before
    assert call(nats) == ("ok", ([0, 2, 4, 6], [False]))
    assert hot_loop_batches(nats) == 0


@pytest.mark.parametrize("action", ["error", "raise"])
def test_errors_answer_as_the_event_loops_path(hot, nats, action):
    before = hot_loop_batches(hot)
    on_hot, on_nats = call(hot, action), call(nats, action)
    assert on_hot == on_nats
    assert on_hot[0] == ("400" if action == "error" else "500"), on_hot
    assert hot_loop_batches(hot) > before
    assert call(hot) == ("ok", ([0, 2, 4, 6], [False]))  # and it goes on serving


def test_a_request_past_its_deadline_answers_as_the_event_loops_path(hot, nats):
    """The model runs past the request's deadline (the gateway's `request_timeout_s`) and sees it
    cancelled (`is_cancelled`): the client's outcome is the same on both roads, and the instance
    serves the next request."""
    before = hot_loop_batches(hot)
    on_hot, on_nats = call(hot, "outlive"), call(nats, "outlive")
    assert on_hot == on_nats, (on_hot, on_nats)
    assert on_hot[0] != "ok", on_hot  # the client heard of its deadline, not of an answer
    wait_until(lambda: hot_loop_batches(hot) > before, 30, "the late batch ran on the hot loop", 0.1)
    assert call(hot) == ("ok", ([0, 2, 4, 6], [False]))


def unnamed(message: object) -> str:
    """A message with the worker's id (each cluster's own) left out."""
    return re.sub(r"worker \S+", "worker …", str(message))


def crash(running: Running, repository: Path) -> tuple[float, tuple[str, object]]:
    marker = repository / "hot" / "1" / "crashing"
    marker.unlink(missing_ok=True)
    started = time.monotonic()
    outcome = call(running, "crash")
    answered = time.monotonic() - started
    assert marker.exists(), "the model ran the request"
    return answered, outcome


def test_a_crashing_model_answers_as_the_event_loops_path_and_comes_back(hot, nats, repository):
    hot_s, on_hot = crash(hot, repository)
    nats_s, on_nats = crash(nats, repository)
    assert on_hot[0] in ("500", "503"), on_hot
    assert (on_hot[0], unnamed(on_hot[1])) == (on_nats[0], unnamed(on_nats[1])), (on_hot, on_nats)
    assert hot_s < 5, f"the client waited {hot_s:.1f} s for a crashed instance's answer"
    for running in (hot, nats):
        wait_until(lambda r=running: call(r)[0] == "ok", 60, "the instance restarted and serves", 0.2)
    before = hot_loop_batches(hot)
    wait_until(  # the new instance process's channel opens on its first batches, then its hot loop runs them
        lambda: call(hot)[0] == "ok" and hot_loop_batches(hot) > before, 30, "the new instance's hot loop", 0.05
    )


def test_metrics_count_the_hot_loops_requests(hot):
    def successes() -> float:
        with urllib.request.urlopen(hot.metrics_url, timeout=10) as answer:
            text = answer.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("nv_inference_request_success{") and 'model="hot"' in line
        )

    before = successes()
    for _ in range(5):
        assert call(hot)[0] == "ok"
    wait_until(lambda: successes() >= before + 5, 30, "the five requests on /metrics", 0.1)


def test_outputs_too_big_to_travel_inline_leave_the_hot_loop_by_the_tensor_store(hot, nats):
    before = hot_loop_batches(hot)
    on_hot, on_nats = call(hot, "grow"), call(nats, "grow")
    assert on_hot == on_nats and on_hot[0] == "ok"
    assert on_hot[1][0] == [0, 2, 4, 6] * 65536
    assert hot_loop_batches(hot) == before + 1


def test_a_batch_the_hot_loop_cannot_take_goes_to_the_event_loop(hot):
    """Inputs too big to travel inline wait in the tensor store (shared memory): the event loop
    fetches them and runs the batch, as before; it still came by the channel."""
    assert call(hot)[0] == "ok"
    hot_before, channel_before = hot_loop_batches(hot), channel_batches(hot)
    size = 64 * 1024  # 256 KiB of FP32: over the gateway's inline_max_bytes
    status, outputs = call(hot, size=size)
    assert status == "ok" and outputs[0] == [2.0 * i for i in range(size)]
    assert hot_loop_batches(hot) == hot_before
    assert channel_batches(hot) == channel_before + 1


@pytest.mark.parametrize("road", ["hot", "nats"])
def test_a_call_its_client_cancels_is_seen_cancelled_by_the_model(hot, nats, repository, road):
    """A gRPC call cancelled while the model runs it: the model's `is_cancelled()` turns true, on
    the hot loop as on the event loop's path, and the instance serves the next request."""
    running = hot if road == "hot" else nats
    tag = f"{road}-{uuid.uuid4().hex[:6]}"
    folder = repository / "hot" / "1"
    tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
    before = hot_loop_batches(running)
    done: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(running.grpc_url) as client:
        call = client.async_infer(
            "hot",
            [tensor],
            callback=lambda result, error: done.put((result, error)),
            parameters={"action": "wait_cancel", "tag": tag},
        )
        wait_until((folder / f"running-{tag}").exists, 20, "the model running the call", 0.02)
        call.cancel()
        result, error = done.get(timeout=20)
        assert result is None and "CANCELLED" in error.status()
        wait_until((folder / f"cancelled-{tag}").exists, 15, "the model seeing is_cancelled()", 0.05)
    assert call_ok(running)
    if road == "hot":
        assert hot_loop_batches(hot) > before
    else:
        assert hot_loop_batches(nats) == 0


def call_ok(running: Running) -> bool:
    return call(running) == ("ok", ([0, 2, 4, 6], [False]))
