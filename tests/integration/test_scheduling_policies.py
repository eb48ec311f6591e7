"""Priorities, queue policies (size, REJECT, DELAY, timeout override), cancellation and batch
formation, on models with one instance that take a while per execution, with the default worker
credits (two per instance): a batch is formed when the instance frees, as in Triton, unless the
batch formed earlier could not differ (docs/scheduling.md)."""

from __future__ import annotations

import contextlib
import socket
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from shared.process.settings import WorkerSettings
from tests.cluster import running_cluster
from tests.serving import wait_until

CREDITS = WorkerSettings().credits_per_instance  # what every user gets

POLICIES = {  # one-instance python models that take 0.2 s an execution, or as long as the test holds them
    "slow_priority": (1, "priority_levels: 2 default_priority_level: 2"),
    "slow_limited": (1, "default_queue_policy { max_queue_size: 2 }"),
    "slow_reject": (1, "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100000 }"),
    "slow_delay": (
        1,
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 60000000 "
        "allow_timeout_override: true }",
    ),
    "slow_override": (
        1,
        "default_queue_policy { default_timeout_microseconds: 60000000 allow_timeout_override: true }",
    ),
    "slow_plain": (1, ""),
    "slow_batching": (8, ""),
}


def config(name: str, batching: str) -> str:
    """A one-instance onnxruntime model's config (other modules' slow `tests/integration/slow_model.py` models)."""
    return (
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 1\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f"dynamic_batching {{ {batching} }}\ninstance_group [ {{ count: 1 kind: KIND_CPU }} ]\n"
    )


# 0.2 s an execution, and longer while the test holds the model's gate open: on a loaded machine
# the test, not a timing, decides how long the instance stays busy (a test that watches the queue
# while the instance runs needs it busy for as long as the test takes to look)
SLEEPY = """
import json, os, time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.gate = json.loads(args["model_config"])["parameters"]["gate"]["string_value"]

    def execute(self, requests):
        time.sleep(0.2)
        deadline = time.monotonic() + 60
        while os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.005)
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""


def sleepy_config(name: str, max_batch_size: int, batching: str, gate: Path) -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f"dynamic_batching {{ {batching} }}\ninstance_group [ {{ count: 1 kind: KIND_CPU }} ]\n"
        f'parameters {{ key: "gate" value: {{ string_value: "{gate}" }} }}\n'
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory, shape) -> Path:
    """A repository per cluster shape: the models' gate files must not be shared between them."""
    return tmp_path_factory.mktemp(f"slow-{shape}")


@pytest.fixture(scope="module")
def slow(root, shape):
    for name, (max_batch_size, batching) in POLICIES.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(textwrap.dedent(SLEEPY))
        (root / name / "config.pbtxt").write_text(sleepy_config(name, max_batch_size, batching, root / f"{name}.gate"))
    with running_cluster(root, shape=shape) as running:
        wait_until(lambda: all(gauge(running, "shoal_queue_free_credits", m) == CREDITS for m in POLICIES), 60)
        yield running


@contextlib.contextmanager
def held(root: Path, model: str) -> Iterator[None]:
    """The model's executions do not end while this is open."""
    gate = root / f"{model}.gate"
    gate.touch()
    try:
        yield
    finally:
        gate.unlink()


def gauge(running, name: str, model: str) -> float:
    with urllib.request.urlopen(running.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sum(s.value for s in family.samples if s.labels["model"] == model)
    return 0.0


def pending(running, model: str) -> float:
    return gauge(running, "nv_inference_pending_request_count", model)


def raw_request(running, model: str) -> socket.socket:
    """A one-row FP32 request sent on a raw connection, left open: closing it is the client leaving."""
    body = b'{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"FP32","data":[5]}]}'
    host, port = running.url.split(":")
    raw = socket.create_connection((host, int(port)))
    head = f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    raw.sendall(head.encode() + body)
    return raw


def busy(running, model: str) -> bool:
    """The model's only instance runs a batch: nothing waits, one of its credits is taken."""
    return pending(running, model) == 0 and gauge(running, "shoal_queue_free_credits", model) == CREDITS - 1


def failures(running, model: str, reason: str) -> float:
    with urllib.request.urlopen(running.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "nv_inference_request_failure":
            return sum(s.value for s in family.samples if s.labels["model"] == model and s.labels["reason"] == reason)
    return 0.0


class Sender:
    """Requests from threads, recording when each answer came and what it was."""

    def __init__(self, running, model: str) -> None:
        self.running, self.model = running, model
        self.done: dict[str, tuple[float, object]] = {}
        self.threads: list[threading.Thread] = []

    def send(self, tag: str, value: float, **kwargs) -> None:
        def run() -> None:
            client = httpclient.InferenceServerClient(self.running.url, network_timeout=60)
            tensor = httpclient.InferInput("INPUT0", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.full((1, 1), value, np.float32))
            try:
                outcome = client.infer(self.model, [tensor], **kwargs).as_numpy("OUTPUT0")[0, 0]
            except InferenceServerException as exc:
                outcome = exc
            self.done[tag] = (time.monotonic(), outcome)
            client.close()

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(60)


def test_higher_priority_is_served_first(slow, root):
    sender = Sender(slow, "slow_priority")
    with held(root, "slow_priority"):
        sender.send("running", 0)  # occupies the only instance
        wait_until(lambda: busy(slow, "slow_priority") and "running" not in sender.done)
        for i in range(3):
            sender.send(f"low{i}", 1, priority=2)
            wait_until(lambda i=i: pending(slow, "slow_priority") == i + 1)
        sender.send("high", 2, priority=1)
        wait_until(lambda: pending(slow, "slow_priority") == 4)
    sender.join()
    order = sorted(sender.done, key=lambda tag: sender.done[tag][0])
    assert order.index("high") < order.index("low0"), order
    assert [t for t in order if t.startswith("low")] == ["low0", "low1", "low2"]  # FIFO within a level


def test_max_queue_size_rejects_at_arrival(slow, root):
    sender = Sender(slow, "slow_limited")
    with held(root, "slow_limited"):
        sender.send("running", 0)
        wait_until(lambda: busy(slow, "slow_limited") and "running" not in sender.done)
        for i in range(4):
            sender.send(f"q{i}", i)
        wait_until(lambda: len(sender.done) == 2)  # two queued, two refused at once
    sender.join()
    errors = [o for _, o in sender.done.values() if isinstance(o, InferenceServerException)]
    assert len(errors) == 2, sender.done
    assert all(e.status() == "503" and "Exceeds maximum queue size" in e.message() for e in errors)


def test_reject_after_queue_timeout(slow, root):
    before = failures(slow, "slow_reject", "REJECTED")
    sender = Sender(slow, "slow_reject")
    with held(root, "slow_reject"):
        sender.send("running", 0)
        wait_until(lambda: busy(slow, "slow_reject") and "running" not in sender.done)
        for i in range(3):  # nothing goes ahead to the busy instance under a queue policy: all wait
            sender.send(f"r{i}", i)
        wait_until(lambda: len(sender.done) == 3)  # past the 100 ms, while the instance still runs
    sender.join()
    errors = [o for _, o in sender.done.values() if isinstance(o, InferenceServerException)]
    assert len(errors) == 3 and all(e.status() == "503" and e.message() == "Request timeout expired" for e in errors)
    assert failures(slow, "slow_reject", "REJECTED") == before + len(errors)


def test_delay_serves_timed_out_requests_after_the_others(slow, root):
    sender = Sender(slow, "slow_delay")
    with held(root, "slow_delay"):
        sender.send("running", 0)
        wait_until(lambda: busy(slow, "slow_delay") and "running" not in sender.done)
        sender.send("early", 1, timeout=1000)  # times out after 1 ms: delayed behind the requests that did not
        wait_until(lambda: pending(slow, "slow_delay") == 1)
        sender.send("late", 2)  # 60 s queue timeout: never times out here
        wait_until(lambda: pending(slow, "slow_delay") == 2)
    sender.join()
    assert all(not isinstance(o, Exception) for _, o in sender.done.values()), sender.done
    assert sender.done["late"][0] < sender.done["early"][0]


def test_request_timeout_overrides_a_longer_default(slow, root):
    sender = Sender(slow, "slow_override")
    with held(root, "slow_override"):
        sender.send("running", 0)
        wait_until(lambda: busy(slow, "slow_override") and "running" not in sender.done)
        started = time.monotonic()
        sender.send("short", 1, timeout=20000)  # 20 ms instead of the model's 60 s
        wait_until(lambda: "short" in sender.done)
    sender.join()
    outcome = sender.done["short"][1]
    assert isinstance(outcome, InferenceServerException) and outcome.message() == "Request timeout expired"
    assert sender.done["short"][0] - started < 5


def test_client_disconnect_cancels_the_queued_request(slow, root):
    before = failures(slow, "slow_plain", "CANCELED")
    sender = Sender(slow, "slow_plain")
    with held(root, "slow_plain"):
        sender.send("running", 0)
        wait_until(lambda: busy(slow, "slow_plain") and "running" not in sender.done)
        sender.send("ahead", 1)  # sent ahead to the instance: the next one waits here
        wait_until(lambda: gauge(slow, "shoal_queue_free_credits", "slow_plain") == 0)
        raw = raw_request(slow, "slow_plain")
        wait_until(lambda: pending(slow, "slow_plain") == 2)
        raw.close()  # the client goes away while its request waits in the queue
        wait_until(lambda: failures(slow, "slow_plain", "CANCELED") == before + 1)
    sender.join()
    assert pending(slow, "slow_plain") == 0


def test_a_higher_priority_request_overtakes_one_queued_before_it(slow, root):
    """Triton forms the next batch when the instance frees: a priority-1 request that arrives
    after a queued priority-2 one runs before it, whatever credits the worker grants."""
    sender = Sender(slow, "slow_priority")
    with held(root, "slow_priority"):
        sender.send("running", 0, priority=2)
        wait_until(lambda: busy(slow, "slow_priority") and "running" not in sender.done)
        sender.send("p2", 1, priority=2)
        wait_until(lambda: pending(slow, "slow_priority") == 1)
        sender.send("p1", 2, priority=1)
        wait_until(lambda: pending(slow, "slow_priority") == 2)
    sender.join()
    order = sorted(sender.done, key=lambda tag: sender.done[tag][0])
    assert order == ["running", "p1", "p2"], sender.done


def test_requests_arriving_while_the_instance_runs_form_one_batch(slow, root):
    """With no queue delay, the requests that arrived while the only instance was busy run
    together when it frees (Triton's batches grow under load), not one ahead of the others."""
    before = model_stats(slow, "slow_batching")
    sender = Sender(slow, "slow_batching")
    with held(root, "slow_batching"):
        sender.send("running", 0)
        wait_until(lambda: busy(slow, "slow_batching") and "running" not in sender.done)
        for i in range(4):
            sender.send(f"r{i}", i + 1)
        wait_until(lambda: pending(slow, "slow_batching") == 4)
    sender.join()
    assert all(not isinstance(o, Exception) for _, o in sender.done.values()), sender.done
    stats = model_stats(slow, "slow_batching")
    assert int(stats["execution_count"]) - int(before["execution_count"]) == 2, stats
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    assert sizes == {1: 1, 4: 1}, stats


def model_stats(running, model: str) -> dict:
    client = httpclient.InferenceServerClient(running.url)
    try:
        return client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()


def test_a_request_cancelled_while_sent_ahead_counts_as_never_executed(slow, root):
    """slow_plain's batches of one go ahead to its busy instance (docs/scheduling.md): one whose
    client leaves while it waits there is CANCELED, as if it had waited here, and the statistics
    count only what Triton would have executed (the worker still runs it, unseen)."""
    before = model_stats(slow, "slow_plain")
    sender = Sender(slow, "slow_plain")
    with held(root, "slow_plain"):
        sender.send("running", 0)
        wait_until(lambda: busy(slow, "slow_plain") and "running" not in sender.done)
        raw = raw_request(slow, "slow_plain")
        # sent ahead: waiting at the instance, both credits taken
        wait_until(
            lambda: pending(slow, "slow_plain") == 1 and gauge(slow, "shoal_queue_free_credits", "slow_plain") == 0
        )
        raw.close()
        wait_until(lambda: pending(slow, "slow_plain") == 0)
    sender.join()
    wait_until(lambda: gauge(slow, "shoal_queue_free_credits", "slow_plain") == CREDITS)  # it ran, unseen
    after = model_stats(slow, "slow_plain")
    stats = after["inference_stats"]
    assert int(after["execution_count"]) - int(before["execution_count"]) == 1, (before, after)
    assert int(after["inference_count"]) - int(before["inference_count"]) == 1, (before, after)
    assert int(stats["success"]["count"]) == int(stats["compute_infer"]["count"]), stats
    assert int(stats["fail"]["count"]) - int(before["inference_stats"]["fail"]["count"]) == 1, (before, after)
