"""The sequence batcher: stateful models, slots, backlog, idle timeout and Triton's errors,
on a real cluster with two workers, driven by tritonclient.http."""

from __future__ import annotations

import json
import os
import signal
import socket
import textwrap
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from services.repository import examples
from tests.cluster import running_cluster
from tests.serving import wait_until

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] }
  ]"""

PY_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle}
  {strategy}
  {controls}
}}
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""

# Triton's classic stateful python model: state per correlation id, reset on START, dropped at END.
# It also checks that the control tensors agree with `flags()`, and may be asked to be slow.
ACCUMULATOR = """
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}
        self.model_dir = args["model_repository"]

    def execute(self, requests):
        responses = []
        for request in requests:
            delay = json.loads(request.parameters()).get("delay", 0)
            if delay:
                time.sleep(delay)
            given = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            value = int(given.reshape(-1)[0])
            cid, flags = request.correlation_id(), request.flags()
            start = flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
            tensor = pb_utils.get_input_tensor_by_name(request, "START")
            if tensor is not None and bool(tensor.as_numpy().reshape(-1)[0]) != bool(start):
                raise ValueError("START control disagrees with flags()")
            if start or cid not in self.sums:
                if not start:
                    raise ValueError(f"sequence {cid} continued on an instance that never saw its START")
                self.sums[cid] = 0
            self.sums[cid] += value
            total = self.sums[cid]
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                del self.sums[cid]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", np.full(given.shape, total, dtype=np.int32))]))
        return responses

    def sequence_ended(self, correlation_id, reason):  # Shoal's optional hook: a sequence ended without END
        self.sums.pop(correlation_id, None)
        open(f"{self.model_dir}/ended-{correlation_id}-{reason.replace(' ', '_')}", "w").close()
"""


def onnx_accumulator() -> object:
    """acc = STATE_IN * (1 - START) + INPUT * READY; OUTPUT = STATE_OUT = acc; CORRID_OUT = CORRID."""
    f = TensorProto.FLOAT
    io = examples._io
    nodes = [
        helper.make_node("Sub", ["ONE", "START"], ["KEEP"]),
        helper.make_node("Mul", ["STATE_IN", "KEEP"], ["KEPT"]),
        helper.make_node("Mul", ["INPUT", "READY"], ["ADDED"]),
        helper.make_node("Add", ["KEPT", "ADDED"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
        helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]),
    ]
    one = helper.make_tensor("ONE", f, [], [1.0])
    return helper.make_graph(
        nodes,
        "onnx_accumulator",
        [
            io("INPUT", f, ["b", 1]),
            io("START", f, ["b", 1]),
            io("READY", f, ["b", 1]),
            io("CORRID", TensorProto.UINT64, ["b", 1]),
            io("STATE_IN", f, ["b", 1]),
        ],
        [io("OUTPUT", f, ["b", 1]), io("STATE_OUT", f, ["b", 1]), io("CORRID_OUT", TensorProto.UINT64, ["b", 1])],
        [one],
    )


# the idle time, as the python models': Triton's default 1 s is the time between a response and the
# client's next request, which a loaded machine stretches past 1 s (every sequence released at once)
ONNX_CONFIG = """
name: "{name}"
backend: "onnxruntime"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }}, {{ name: "CORRID_OUT" data_type: TYPE_UINT64 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
  state [ {{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ]
             initial_state {{ data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "zero" }} }} ]
}}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

ENSEMBLE_CONFIG = """
name: "acc_pipeline"
platform: "ensemble"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "onnx_acc" model_version: -1
  input_map { key: "INPUT" value: "X" } output_map { key: "OUTPUT" value: "Y" } } ] }
"""

OLDEST = "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 5000 }"
DIRECT = "direct { }"


def _python_model(
    root,
    name: str,
    mbs: int = 4,
    idle: int = 5_000_000,
    strategy: str = DIRECT,
    count: int = 1,
    controls: str = CONTROLS,
) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(textwrap.dedent(ACCUMULATOR))
    (root / name / "config.pbtxt").write_text(
        PY_CONFIG.format(name=name, mbs=mbs, idle=idle, strategy=strategy, count=count, controls=controls)
    )


@pytest.fixture(scope="module")
def seq_cluster(tmp_path_factory, shape):
    root = tmp_path_factory.mktemp("sequences")
    _python_model(root, "py_acc", count=2)  # 2 workers x 2 instances x 4 slots
    _python_model(
        root, "py_oldest", strategy="oldest { max_candidate_sequences: 3 max_queue_delay_microseconds: 1000 }"
    )
    _python_model(root, "py_one", mbs=0, controls="")  # one slot per worker: a backlog forms at once
    _python_model(root, "py_idle", mbs=2, idle=400_000)  # short idle timeout
    examples.write_model(root, "onnx_acc", onnx_accumulator(), ONNX_CONFIG.format(name="onnx_acc", strategy=DIRECT))
    examples.write_model(
        root, "onnx_oldest", onnx_accumulator(), ONNX_CONFIG.format(name="onnx_oldest", strategy=OLDEST)
    )
    (root / "acc_pipeline" / "1").mkdir(parents=True)  # an ensemble whose step is a sequence model
    (root / "acc_pipeline" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    with running_cluster(root, workers=2, worker={"credits_per_instance": 1}, shape=shape) as running:
        # ready means one instance is; these tests count slots, so wait for every instance of both workers
        instances = {"py_acc": 4, "py_oldest": 2, "py_one": 2, "py_idle": 2, "onnx_acc": 2, "onnx_oldest": 2}
        wait_until(
            lambda: all(_gauge(running, "shoal_queue_free_credits", m) == n for m, n in instances.items()), timeout=60
        )
        running.root = root
        yield running


def _int_input(value: int, batch: int = 1) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT", [batch, 1], "INT32")
    tensor.set_data_from_numpy(np.full((batch, 1), value, np.int32))
    return [tensor]


def _nobatch_input(value: int) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return [tensor]


def _fp_input(value: float) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], np.float32))
    return [tensor]


def _run_sequence(url: str, model: str, corrid, values: list[int], make=_int_input) -> list[int]:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    try:
        out = []
        for i, value in enumerate(values):
            result = client.infer(
                model, make(value), sequence_id=corrid, sequence_start=i == 0, sequence_end=i == len(values) - 1
            )
            out.append(int(result.as_numpy("OUTPUT").reshape(-1)[0]))
        return out
    finally:
        client.close()


def _sent(running, pool: ThreadPoolExecutor, model: str, inputs: list, **kwargs) -> Future:
    """`infer` on a thread of `pool`, with a client of its own. tritonclient's `async_infer` sends
    only while its caller yields to gevent (10 ms after the call, then in `get_result`): a request
    it started may still be unsent while the test blocks outside gevent (a metrics poll), and on
    a loaded machine it was, so the poll waited for a request the server never saw."""

    def infer() -> httpclient.InferResult:
        client = httpclient.InferenceServerClient(running.url, network_timeout=60)
        try:
            return client.infer(model, inputs, **kwargs)
        finally:
            client.close()

    return pool.submit(infer)


def _gauge(running, name: str, model: str) -> float:
    with urllib.request.urlopen(running.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sum(s.value for s in family.samples if s.labels.get("model") == model)
    return 0.0


def test_interleaved_sequences_keep_their_state_and_order(seq_cluster):
    """24 concurrent clients, uint64 and string ids, over 2 workers x 2 instances: every request of a
    sequence reaches the instance that saw its START (the model fails otherwise), in order."""
    values = list(range(1, 13))
    expected = list(np.cumsum(values))
    ids = [2**64 - 1 - i for i in range(12)] + [f"client-{i}" for i in range(12)]
    with ThreadPoolExecutor(len(ids)) as pool:
        results = list(pool.map(lambda cid: _run_sequence(seq_cluster.url, "py_acc", cid, values), ids))
    assert all(r == expected for r in results)


def test_oldest_strategy_python(seq_cluster):
    values = [5, 1, 2, 3, 4, 5]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda cid: _run_sequence(seq_cluster.url, "py_oldest", cid, values), range(1, 9)))
    assert all(r == list(np.cumsum(values)) for r in results)


@pytest.mark.parametrize("model", ["onnx_acc", "onnx_oldest"])
def test_onnx_controls_and_implicit_state(seq_cluster, model):
    client = httpclient.InferenceServerClient(seq_cluster.url)

    def run(corrid: int) -> list[tuple[float, int]]:
        c = httpclient.InferenceServerClient(seq_cluster.url)
        out = []
        for i, value in enumerate([1.0, 2.0, 3.0, 4.0]):
            r = c.infer(
                model, _fp_input(value * corrid), sequence_id=corrid, sequence_start=i == 0, sequence_end=i == 3
            )
            out.append((float(r.as_numpy("OUTPUT")[0, 0]), int(r.as_numpy("CORRID_OUT")[0, 0])))
        c.close()
        return out

    with ThreadPoolExecutor(6) as pool:
        results = dict(zip(range(1, 7), pool.map(run, range(1, 7))))
    for corrid, out in results.items():
        assert out == [(1.0 * corrid, corrid), (3.0 * corrid, corrid), (6.0 * corrid, corrid), (10.0 * corrid, corrid)]
    with pytest.raises(InferenceServerException) as err:  # the CORRID control is UINT64
        client.infer(model, _fp_input(1), sequence_id="text", sequence_start=True)
    assert err.value.status() == "400" and "must specify an unsigned integer correlation ID" in err.value.message()
    # a reused id starts from the initial state again; the state output never reaches the client
    r = client.infer(model, _fp_input(7), sequence_id=1, sequence_start=True)
    assert float(r.as_numpy("OUTPUT")[0, 0]) == 7.0 and r.as_numpy("STATE_OUT") is None
    r = client.infer(model, _fp_input(1), sequence_id=1, sequence_end=True)
    assert float(r.as_numpy("OUTPUT")[0, 0]) == 8.0
    client.close()


def test_triton_errors(seq_cluster):
    client = httpclient.InferenceServerClient(seq_cluster.url)
    cases = [
        (
            dict(inputs=_int_input(1)),
            "inference request to model 'py_acc' must specify a non-zero or non-empty correlation ID",
        ),
        (
            dict(inputs=_int_input(1, batch=2), sequence_id=5, sequence_start=True),
            "inference request to model 'py_acc' must specify batch-size 1 due to requirements of sequence batcher",
        ),
        (
            dict(inputs=_int_input(1), sequence_id=424242),
            "inference request for sequence 424242 to model 'py_acc' must specify the START flag on the first request of "
            "the sequence",
        ),
        (
            dict(inputs=_int_input(1), sequence_id="nope"),
            "inference request for sequence nope to model 'py_acc' must specify the START flag on the first request of "
            "the sequence",
        ),
    ]
    for kwargs, message in cases:
        with pytest.raises(InferenceServerException) as err:
            client.infer("py_acc", **kwargs)
        assert err.value.status() == "400" and err.value.message() == message
    # END forgets the id: the next request needs START again
    assert _run_sequence(seq_cluster.url, "py_acc", 77, [1, 2]) == [1, 3]
    with pytest.raises(InferenceServerException) as err:
        client.infer("py_acc", _int_input(1), sequence_id=77)
    assert "must specify the START flag" in err.value.message()
    # a second START for a live id: the old sequence ends early, the new one goes on in its slot
    client.infer("py_acc", _int_input(10), sequence_id=78, sequence_start=True)
    assert int(client.infer("py_acc", _int_input(1), sequence_id=78, sequence_start=True).as_numpy("OUTPUT")[0, 0]) == 1
    assert int(client.infer("py_acc", _int_input(2), sequence_id=78, sequence_end=True).as_numpy("OUTPUT")[0, 0]) == 3
    client.close()


def test_backlog_waits_for_the_next_ending_sequence(seq_cluster):
    """py_one has one slot per worker (2 in all): a third sequence waits in the backlog and takes
    the slot of the first sequence that ends, with everything it queued meanwhile."""
    client = httpclient.InferenceServerClient(seq_cluster.url, concurrency=4)
    assert int(client.infer("py_one", _nobatch_input(1), sequence_id=1, sequence_start=True).as_numpy("OUTPUT")[0]) == 1
    assert int(client.infer("py_one", _nobatch_input(2), sequence_id=2, sequence_start=True).as_numpy("OUTPUT")[0]) == 2
    with ThreadPoolExecutor(2) as pool:
        # both wait in the backlog (no slot is free until a sequence ends), and stay there until one
        # does; the second is sent once the first (its START) is queued
        first = _sent(seq_cluster, pool, "py_one", _nobatch_input(3), sequence_id=3, sequence_start=True)
        wait_until(lambda: _gauge(seq_cluster, "nv_inference_pending_request_count", "py_one") == 1)
        second = _sent(seq_cluster, pool, "py_one", _nobatch_input(4), sequence_id=3)
        wait_until(lambda: _gauge(seq_cluster, "nv_inference_pending_request_count", "py_one") == 2)
        ended = client.infer("py_one", _nobatch_input(10), sequence_id=1, sequence_end=True)
        assert int(ended.as_numpy("OUTPUT")[0]) == 11
        assert int(first.result().as_numpy("OUTPUT")[0]) == 3
        assert int(second.result().as_numpy("OUTPUT")[0]) == 7
    client.infer("py_one", _nobatch_input(0), sequence_id=2, sequence_end=True)
    client.infer("py_one", _nobatch_input(0), sequence_id=3, sequence_end=True)
    client.close()


def test_idle_timeout_frees_the_slot_and_fails_queued_requests(seq_cluster):
    client = httpclient.InferenceServerClient(seq_cluster.url, concurrency=8)
    # an abandoned sequence: after the idle time, its id needs START again (Triton's text)
    client.infer("py_idle", _int_input(1), sequence_id="gone", sequence_start=True)
    time.sleep(1.0)  # the subject under test is elapsed time: 2.5x the idle time (polling would keep it alive)
    with pytest.raises(InferenceServerException) as err:
        client.infer("py_idle", _int_input(1), sequence_id="gone")
    assert err.value.message() == (
        "inference request for sequence gone to model 'py_idle' must specify the START "
        "flag on the first request of the sequence"
    )
    # the model was told (server#3652: Triton tells the backend nothing)
    wait_until(lambda: (seq_cluster.root / "py_idle" / "ended-gone-idle_timeout").exists(), timeout=10)
    # two slow sequences keep both instances busy (one credit each); a third sequence's START waits
    # for a credit longer than the idle time: it is answered with an error, not dropped
    with ThreadPoolExecutor(3) as pool:
        slow = [
            _sent(
                seq_cluster,
                pool,
                "py_idle",
                _int_input(1),
                sequence_id=100 + i,
                sequence_start=True,
                parameters={"delay": 2.0},
            )
            for i in range(2)
        ]
        wait_until(lambda: _gauge(seq_cluster, "shoal_queue_free_credits", "py_idle") == 0)
        waiting = _sent(seq_cluster, pool, "py_idle", _int_input(1), sequence_id=200, sequence_start=True)
        with pytest.raises(InferenceServerException) as err:
            waiting.result()
        assert err.value.status() == "503"
        assert err.value.message() == (
            "sequence 200 to model 'py_idle' timed out: no request for 400000 us (max_sequence_idle_microseconds)"
        )
        assert [int(s.result().as_numpy("OUTPUT")[0, 0]) for s in slow] == [1, 1]
    with pytest.raises(InferenceServerException) as err:
        client.infer("py_idle", _int_input(1), sequence_id=200)
    assert err.value.status() == "400" and "must specify the START flag" in err.value.message()
    client.close()


def _raw_infer(running, model: str, body: bytes) -> socket.socket:
    host, port = running.url.split(":")
    raw = socket.create_connection((host, int(port)))
    raw.sendall(
        b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
        % (model.encode(), len(body), body)
    )
    return raw


def _failures(running, model: str, reason: str) -> float:
    with urllib.request.urlopen(running.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "nv_inference_request_failure":
            return sum(s.value for s in family.samples if s.labels["model"] == model and s.labels["reason"] == reason)
    return 0.0


def test_cancelled_backlogged_sequence_releases_nothing_twice(seq_cluster):
    """A client that disconnects while its sequence waits in the backlog: the request is cancelled,
    and the model still has exactly its two slots (a double release would serve a third sequence)."""
    client = httpclient.InferenceServerClient(seq_cluster.url, concurrency=4)
    pending = lambda: _gauge(seq_cluster, "nv_inference_pending_request_count", "py_one")  # noqa: E731
    for corrid in (11, 12):
        client.infer("py_one", _nobatch_input(1), sequence_id=corrid, sequence_start=True)
    before = _failures(seq_cluster, "py_one", "CANCELED")
    body = (
        b'{"inputs":[{"name":"INPUT","shape":[1],"datatype":"INT32","data":[5]}],'
        b'"parameters":{"sequence_id":13,"sequence_start":true,"sequence_end":true}}'
    )
    raw = _raw_infer(seq_cluster, "py_one", body)
    wait_until(lambda: pending() == 1)
    raw.close()
    wait_until(lambda: _failures(seq_cluster, "py_one", "CANCELED") == before + 1)
    assert pending() == 0
    client.infer("py_one", _nobatch_input(1), sequence_id=11, sequence_end=True)  # frees one slot
    client.infer("py_one", _nobatch_input(1), sequence_id=14, sequence_start=True)  # takes it
    with ThreadPoolExecutor(1) as pool:
        waiting = _sent(seq_cluster, pool, "py_one", _nobatch_input(7), sequence_id=15, sequence_start=True)
        wait_until(lambda: pending() == 1)  # no third slot: it waits
        client.infer("py_one", _nobatch_input(1), sequence_id=12, sequence_end=True)
        assert int(waiting.result().as_numpy("OUTPUT")[0]) == 7
    for corrid in (14, 15):
        client.infer("py_one", _nobatch_input(0), sequence_id=corrid, sequence_end=True)
    client.close()


def test_request_timeout_rejects_a_backlogged_sequence(seq_cluster):
    """Triton (direct): a request's `timeout` applies while its sequence waits for a slot."""
    client = httpclient.InferenceServerClient(seq_cluster.url, concurrency=4)
    for corrid in (21, 22):
        client.infer("py_one", _nobatch_input(1), sequence_id=corrid, sequence_start=True)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as err:
        client.infer("py_one", _nobatch_input(1), sequence_id=23, sequence_start=True, timeout=200_000)
    assert err.value.status() == "503" and err.value.message() == "Request timeout expired"
    assert time.monotonic() - started < 5
    with pytest.raises(InferenceServerException) as err:
        client.infer("py_one", _nobatch_input(1), sequence_id=23)
    assert "must specify the START flag" in err.value.message()
    for corrid in (21, 22):  # a timeout on a sequence that has its slot changes nothing
        assert (
            int(
                client.infer("py_one", _nobatch_input(1), sequence_id=corrid, sequence_end=True, timeout=1).as_numpy(
                    "OUTPUT"
                )[0]
            )
            == 2
        )
    client.close()


def test_reloading_the_model_loses_its_sequences_with_a_clear_error(tmp_path):
    """A reload replaces the instances (and the state they held): live sequences end with a clear
    error instead of continuing on instances that never saw their START."""
    _python_model(tmp_path, "py_reload")
    with running_cluster(tmp_path, repository={"model_control_mode": "explicit", "load_model": ["py_reload"]}) as r:
        client = httpclient.InferenceServerClient(r.url)
        assert (
            int(client.infer("py_reload", _int_input(5), sequence_id=1, sequence_start=True).as_numpy("OUTPUT")[0, 0])
            == 5
        )
        config = client.get_model_config("py_reload")
        config["sequence_batching"]["max_sequence_idle_microseconds"] = 6_000_000
        client.load_model("py_reload", config=json.dumps(config))
        with pytest.raises(InferenceServerException) as err:
            client.infer("py_reload", _int_input(1), sequence_id=1)
        assert err.value.status() == "400" and "was lost" in err.value.message() and "reloaded" in err.value.message()
        assert (
            int(client.infer("py_reload", _int_input(2), sequence_id=1, sequence_start=True).as_numpy("OUTPUT")[0, 0])
            == 2
        )
        client.close()


def test_an_ensemble_step_continues_the_clients_sequence(seq_cluster):
    """The ensemble passes its request's sequence id and flags to a sequence-batched step."""

    def run(corrid: int, values: list[float]) -> list[float]:
        client = httpclient.InferenceServerClient(seq_cluster.url, network_timeout=60)
        out = []
        for i, value in enumerate(values):
            tensor = httpclient.InferInput("X", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[value]], np.float32))
            result = client.infer(
                "acc_pipeline", [tensor], sequence_id=corrid, sequence_start=i == 0, sequence_end=i == len(values) - 1
            )
            out.append(float(result.as_numpy("Y")[0, 0]))
        client.close()
        return out

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda args: run(*args), [(9001, [1, 2, 3]), (9002, [10, 20, 30])])
    assert first == [1, 3, 6] and second == [10, 30, 60]


def test_a_dead_worker_fails_its_sequences_clearly_and_the_others_go_on(seq_cluster):
    """Runs last: it kills a worker (the supervisor restarts it)."""
    client = httpclient.InferenceServerClient(seq_cluster.url, network_timeout=60)
    ids = list(range(500, 508))
    for corrid in ids:
        client.infer("py_acc", _int_input(1), sequence_id=corrid, sequence_start=True)
    worker = seq_cluster.cluster.child("worker-0").process.pid
    models = _children(worker)  # its python models' processes, which die with it
    os.kill(worker, signal.SIGKILL)
    # until they are gone, one of them may still answer a request sent at once: no test of anything
    _wait_gone([worker, *models])
    outcomes = {}
    for corrid in ids:
        try:
            outcomes[corrid] = int(client.infer("py_acc", _int_input(2), sequence_id=corrid).as_numpy("OUTPUT")[0, 0])
        except InferenceServerException as exc:
            # 503 for the request that was running on the worker, 400 for those that came after
            assert exc.status() in ("400", "503") and "stopped responding" in exc.message(), exc.message()
            outcomes[corrid] = exc.message()
    survived = [c for c, o in outcomes.items() if o == 3]
    lost = [c for c, o in outcomes.items() if isinstance(o, str)]
    assert survived and lost and len(survived) + len(lost) == len(ids), outcomes
    for corrid in lost:  # later requests say why, until the sequence is started again
        with pytest.raises(InferenceServerException) as err:
            client.infer("py_acc", _int_input(2), sequence_id=corrid)
        assert err.value.message() == (
            f"sequence {corrid} to model 'py_acc' was lost: worker "
            f"{err.value.message().split('worker ')[1].split(' ')[0]} stopped responding; "
            "start it again with the START flag"
        )
        client.infer("py_acc", _int_input(2), sequence_id=corrid, sequence_start=True, sequence_end=True)
    for corrid in survived:
        assert (
            int(client.infer("py_acc", _int_input(3), sequence_id=corrid, sequence_end=True).as_numpy("OUTPUT")[0, 0])
            == 6
        )
    client.close()


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _wait_gone(pids: list[int], timeout: float = 30.0) -> None:
    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
        except OSError:
            return False

    wait_until(lambda: not any(alive(pid) for pid in pids), timeout, f"processes {pids} gone with their worker", 0.02)
