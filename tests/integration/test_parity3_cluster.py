"""Triton parity III (issue 28) behaviours against one cluster on a repository of their models,
through tritonclient. Texts and sources: docs/compatibility.md."""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from services.repository import examples
from tests.cluster import identity_config, running_cluster
from tests.integration.ensemble_models import ensemble_config, write_ensemble
from tests.serving import wait_until

F = "TYPE_FP32"


def build_repository(root: Path) -> Path:
    # item 7: an output with a label file (index 2's label is empty: no label, as Triton), an
    # ensemble whose output takes the producing step's labels, and a label file outside the model
    labelled = 'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] label_filename: "labels.txt" } ]'
    for name, label_file in (("classes", "labels.txt"), ("bad_labels", "../labels.txt")):
        config = identity_config(name, "FP32").replace(
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]',
            labelled.replace("labels.txt", label_file),
        )
        model_dir = examples.write_model(root, name, examples.identity_graph(TensorProto.FLOAT, 2, name), config)
        (model_dir / "labels.txt").write_text("cat\ndog\n\nbird\n")
    write_ensemble(
        root,
        "classes_ensemble",
        ensemble_config(
            "classes_ensemble",
            [("IN", F, "-1")],
            [("SCORES", F, "-1")],
            [("classes", {"INPUT0": "IN"}, {"OUTPUT0": "SCORES"})],
        ),
    )
    write_numpy1_model(root)
    # item 9: preferred sizes [2, 6] and a queue delay (Triton's test holds 10 s; 3 s show the same)
    batching = f"dynamic_batching {{ preferred_batch_size: [ 2, 6 ] max_queue_delay_microseconds: {DELAY_US} }}"
    examples.write_model(
        root,
        "preferred",
        examples.identity_graph(TensorProto.FLOAT, 2, "preferred"),
        identity_config("preferred", "FP32", extra=batching),
    )
    # item 11: qa/L0_model_queue's test_timeout_override model
    policy = (
        "dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 10000000 "
        "default_queue_policy { allow_timeout_override: true default_timeout_microseconds: 1000000 } }"
    )
    examples.write_model(
        root,
        "queue_timeout",
        examples.identity_graph(TensorProto.FLOAT, 2, "queue_timeout"),
        identity_config("queue_timeout", "FP32", extra=policy),
    )
    write_ensemble(
        root,
        "queue_timeout_ensemble",
        ensemble_config(
            "queue_timeout_ensemble",
            [("INPUT0", F, "-1")],
            [("OUTPUT0", F, "-1")],
            [("queue_timeout", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"})],
        ),
    )
    write_ragged_model(root)
    write_ragged_onnx_model(root)
    write_batch_input_model(root)
    write_qa_int32_model(root)
    # item 15: qa/L0_model_queue test_priority_with_policy's model (its 10 s delay as 4 s)
    policies = (
        "dynamic_batching { preferred_batch_size: [ 4, 8, 32 ] max_queue_delay_microseconds: 4000000 "
        "priority_levels: 2 default_priority_level: 2 "
        "default_queue_policy { timeout_action: DELAY allow_timeout_override: true default_timeout_microseconds: 11000000 } "
        "priority_queue_policy { key: 2 value: { timeout_action: REJECT allow_timeout_override: true "
        "default_timeout_microseconds: 11000000 } } }"
    )
    examples.write_model(
        root,
        "priority_policy",
        examples.identity_graph(TensorProto.FLOAT, 2, "priority_policy"),
        identity_config("priority_policy", "FP32", max_batch_size=32, extra=policies),
    )
    return root


DELAY_US = 3_000_000

# item 10: a python model whose input is ragged: each request keeps its own shape in execute()
RAGGED_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "SUM", np.array([[pb_utils.get_input_tensor_by_name(r, "X").as_numpy().sum()]], np.float32))])
            for r in requests]
"""


def write_ragged_onnx_model(root: Path) -> None:
    """qa/L0_batcher's onnx ragged model: onnx_nobatch_zero_1_float32 (a 1-D identity) given a max
    batch size, a ragged INPUT0 and OUTPUT0 scattered back with each request's input shape."""
    config = (
        identity_config("ragged_onnx", "FP32").replace("dims: [ -1 ] }", "dims: [ -1 ] allow_ragged_batch: true }", 1)
        + 'batch_output [ { target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT0" } ]\n'
        + f"dynamic_batching {{ preferred_batch_size: [ 2, 6 ] max_queue_delay_microseconds: {DELAY_US} }}\n"
    )
    examples.write_model(root, "ragged_onnx", examples.identity_graph(TensorProto.FLOAT, 1, "ragged_onnx"), config)


BATCH_INPUT_CONFIG = """
name: "ragged_index"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" data_type: TYPE_FP32 source_input: "INPUT0" } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "END" data_type: TYPE_FP32 dims: [ 1 ] } ]
batch_output [ { target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT0" } ]
dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: %d }
"""


def write_batch_input_model(root: Path) -> None:
    """Triton's ragged-batching example (docs/ragged_batching.md): a flat ragged INPUT0 and the
    batch input INDEX, each request's accumulated element count, which this model answers as END
    (one value per request: where the request's elements end in the flat batch)."""
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"]), helper.make_node("Identity", ["INDEX"], ["END"])],
        "ragged_index",
        [
            helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [None]),
            helper.make_tensor_value_info("INDEX", TensorProto.FLOAT, [None]),
        ],
        [
            helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [None]),
            helper.make_tensor_value_info("END", TensorProto.FLOAT, [None]),
        ],
    )
    examples.write_model(root, "ragged_index", graph, BATCH_INPUT_CONFIG % DELAY_US)


def write_ragged_model(root: Path) -> None:
    (root / "ragged" / "1").mkdir(parents=True)
    (root / "ragged" / "1" / "model.py").write_text(RAGGED_MODEL)
    (root / "ragged" / "config.pbtxt").write_text(
        'name: "ragged"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]\n'
        'output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f"dynamic_batching {{ max_queue_delay_microseconds: {DELAY_US} preferred_batch_size: [ 3 ] }}\n"
    )


# item 13: a model.py written for Triton's numpy 1 environment, unchanged
NUMPY1_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            y = np.maximum(x.astype(np.float_), np.NINF) + np.product([1.0]) * np.bool8(True)
            flags = np.array([[np.__version__.encode()]] * len(x), dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("Y", y.astype(np.float64)), pb_utils.Tensor("NUMPY", flags)]))
        return responses
"""


def write_numpy1_model(root: Path) -> None:
    (root / "numpy1_names" / "1").mkdir(parents=True)
    (root / "numpy1_names" / "1" / "model.py").write_text(NUMPY1_MODEL)
    (root / "numpy1_names" / "config.pbtxt").write_text(
        'name: "numpy1_names"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP64 dims: [ 1 ] }, { name: "NUMPY" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
    )


# item 8: gen_qa_models.py's onnx_int32_int32_int32 as qa_model_repository holds it: version 1 from
# create_fixed_models(int32, ..., ("all", None)) (Identity, Add, Sub, Cast; dims [16], max batch 8,
# OUTPUT0's labels), versions 2 and 3 from create_onnx_modelfile(..., swap=True): OUTPUT0 = INPUT0 - INPUT1
QA_INT32_CONFIG = """
name: "onnx_int32_int32_int32"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { all { }}
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
input [ { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] label_filename: "output0_labels.txt" } ]
output [ { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""


def qa_int32_graph(swap: bool) -> object:
    from onnx import helper

    def io(name: str) -> object:
        return helper.make_tensor_value_info(name, TensorProto.INT32, [None, 16])

    nodes = [
        helper.make_node("Identity", ["INPUT0"], ["_INPUT0"]),
        helper.make_node("Identity", ["INPUT1"], ["_INPUT1"]),
        helper.make_node("Add", ["_INPUT0", "_INPUT1"], ["CAST1" if swap else "CAST0"]),
        helper.make_node("Sub", ["_INPUT0", "_INPUT1"], ["CAST0" if swap else "CAST1"]),
        helper.make_node("Cast", ["CAST0"], ["OUTPUT0"], to=TensorProto.INT32),
        helper.make_node("Cast", ["CAST1"], ["OUTPUT1"], to=TensorProto.INT32),
    ]
    inputs, outputs = [io("INPUT0"), io("INPUT1")], [io("OUTPUT0"), io("OUTPUT1")]
    return helper.make_graph(nodes, "onnx_int32_int32_int32", inputs, outputs)


def write_qa_int32_model(root: Path) -> None:
    for version in (1, 2, 3):
        model_dir = examples.write_model(
            root, "onnx_int32_int32_int32", qa_int32_graph(version > 1), QA_INT32_CONFIG, version
        )
    (model_dir / "output0_labels.txt").write_text("".join(f"label{i}\n" for i in range(16)))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_cluster(build_repository(tmp_path_factory.mktemp("parity3")), allow_client_shm=True) as running:
        yield running


@pytest.fixture
def client(served):
    c = httpclient.InferenceServerClient(served.url, network_timeout=60)
    yield c
    c.close()


SCORES = np.array([[0.1, 0.7, 0.3, 0.9]], dtype=np.float32)
TOP3 = [b"0.900000:3:bird", b"0.700000:1:dog", b"0.300000:2"]


# -- item 7: classification labels ----------------------------------------------------------------
@pytest.mark.parametrize("model, tensors", [("classes", ("INPUT0", "OUTPUT0")), ("classes_ensemble", ("IN", "SCORES"))])
def test_classification_entries_carry_the_label_file(served, client, model, tensors):
    source, output = tensors
    tensor = httpclient.InferInput(source, [1, 4], "FP32")
    tensor.set_data_from_numpy(SCORES)
    result = client.infer(model, [tensor], outputs=[httpclient.InferRequestedOutput(output, class_count=3)])
    assert result.as_numpy(output).tolist() == [TOP3]
    grpc = grpcclient.InferenceServerClient(served.grpc_url)
    tensor = grpcclient.InferInput(source, [1, 4], "FP32")
    tensor.set_data_from_numpy(SCORES)
    result = grpc.infer(model, [tensor], outputs=[grpcclient.InferRequestedOutput(output, class_count=3)])
    assert result.as_numpy(output).tolist() == [TOP3]
    grpc.close()


def test_a_label_file_outside_the_model_fails_its_load(served, client):
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert index["bad_labels"]["state"] == "UNAVAILABLE"
    assert index["bad_labels"]["reason"].startswith("label file path '")
    assert index["bad_labels"]["reason"].endswith(
        "' for output 'OUTPUT0' in model 'bad_labels' is outside model directory"
    )


# -- item 13: numpy 1 names in python models --------------------------------------------------------
def test_a_model_written_for_numpy1_runs_unchanged(client):
    x = httpclient.InferInput("X", [2, 1], "FP32")
    x.set_data_from_numpy(np.array([[1.5], [-2.0]], dtype=np.float32))
    result = client.infer("numpy1_names", [x])
    assert result.as_numpy("NUMPY")[0, 0].decode() == np.__version__  # the server's numpy, not an environment
    np.testing.assert_array_equal(result.as_numpy("Y"), [[2.5], [-1.0]])


# -- item 9: preferred batch sizes and the queue delay ------------------------------------------------
def batch_sizes(client: httpclient.InferenceServerClient, model: str) -> dict[int, int]:
    stats = client.get_inference_statistics(model)["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats.get("batch_stats", [])}


def test_a_batch_past_the_largest_preferred_size_goes_and_the_rest_waits_its_delay(served):
    client = httpclient.InferenceServerClient(served.url, concurrency=2, network_timeout=60)
    pending = []
    for rows in (3, 4):  # the 4 arrives while the 3 waits in the batcher
        tensor = httpclient.InferInput("INPUT0", [rows, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((rows, 2), np.float32))
        pending.append((time.monotonic(), client.async_infer("preferred", [tensor])))
    answered = []
    for sent, request in pending:
        request.get_result()
        answered.append(time.monotonic() - sent)
    # 3 + 4 = 7 would pass 6: the 3 ran alone at once; the 4 alone is no preferred size: its full delay
    assert batch_sizes(client, "preferred") == {3: 1, 4: 1}
    assert answered[1] >= DELAY_US / 1e6
    client.close()


# -- item 11: queue policy timeouts with allow_timeout_override ---------------------------------------
def timed_infer(
    running, model: str, protocol: str, rows: int, timeout_us: int, results: dict, key: str, go: threading.Event
) -> None:
    """One request, sent when `go` is set by a client already connected (a gRPC channel's connect
    under load takes longer than the spacing the scenario relies on); (answer, sent, answered)."""
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(running.url if protocol == "http" else running.grpc_url)
    tensor = module.InferInput("INPUT0", [rows, 16], "FP32")
    tensor.set_data_from_numpy(np.zeros((rows, 16), np.float32))
    try:
        client.is_server_live()
        results[key + " connected"] = True
        go.wait(60)
        started = time.monotonic()
        try:
            client.infer(model, [tensor], timeout=timeout_us or None)
            results[key] = ("ok", started, time.monotonic())
        except InferenceServerException as exc:
            results[key] = (exc.message(), started, time.monotonic())
    finally:
        client.close()


def pending(running, model: str) -> float:
    with urllib.request.urlopen(running.metrics_url, timeout=10) as response:
        text = response.read().decode()
    line = f'nv_inference_pending_request_count{{model="{model}",version="1"}} '
    return next((float(row[len(line) :]) for row in text.splitlines() if row.startswith(line)), 0.0)


@pytest.mark.parametrize("model", ["queue_timeout", "queue_timeout_ensemble"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("first_timeout_us, first_leaves_s", [(100_000, 0.1), (10_000_000, 1.0), (0, 1.0)])
def test_a_request_timeout_shortens_the_default_only_and_fails_only_its_request(
    served, model, protocol, first_timeout_us, first_leaves_s
):
    """qa/L0_model_queue test_timeout_override: a 1-row request, then (0.2 s after it is queued) two
    2-row requests. The 1 times out alone (its 100 ms, or the 1 s default: a longer timeout does not
    extend it); the two 2s then form the preferred 4 and run at once, long before the 10 s delay.
    Arriving before the 1, a 2 would time out before it instead (its 1 s ending first): so the
    2s are sent once the 1 is queued, and no later than that, or the 1 (its 100 ms) is gone."""
    results: dict = {}
    args = (served, model, protocol)
    first_go, others_go = threading.Event(), threading.Event()
    first = threading.Thread(target=timed_infer, args=(*args, 1, first_timeout_us, results, "first", first_go))
    others = [threading.Thread(target=timed_infer, args=(*args, 2, 0, results, k, others_go)) for k in ("a", "b")]
    for thread in (first, *others):
        thread.start()
    wait_until(lambda: all(f"{k} connected" in results for k in ("first", "a", "b")), 30, "clients connected")
    first_go.set()
    # queued (or, with its 100 ms, maybe timed out already) in the member's queue: the 2s come after it
    wait_until(lambda: "first" in results or pending(served, "queue_timeout") == 1, 30, "the 1 queued")
    time.sleep(0.2)  # the scenario's spacing (Triton's test's): the 2s' timeouts end 0.2 s after the 1's
    others_go.set()
    for thread in (first, *others):
        thread.join(60)
    assert results["first"][0].endswith("Request timeout expired"), results
    assert [results[k][0] for k in ("a", "b")] == ["ok", "ok"], results
    for key in ("a", "b"):
        _, started, answered = results[key]
        assert answered - results["first"][1] >= first_leaves_s, results  # 1 + 2 + 2 is no preferred size
        assert answered - started < 5.0, results  # the delay is 10 s


# -- item 12: ensemble failure counts ------------------------------------------------------------------
def failures(served, model: str, reason: str) -> int:
    with urllib.request.urlopen(served.metrics_url, timeout=10) as response:
        text = response.read().decode()
    line = f'nv_inference_request_failure{{model="{model}",reason="{reason}",version="1"}} '
    return next((int(float(row[len(line) :])) for row in text.splitlines() if row.startswith(line)), 0)


def test_a_member_rejecting_counts_each_failed_ensemble_request_as_triton_does(served):
    """qa/L0_model_queue test_policy_reject: per failed ensemble request Triton counts two OTHER
    failures for the ensemble (its error answer, then its statistics) and one REJECTED for the member."""
    before = failures(served, "queue_timeout_ensemble", "OTHER"), failures(served, "queue_timeout", "REJECTED")
    for protocol in ("http", "grpc"):
        test_a_request_timeout_shortens_the_default_only_and_fails_only_its_request(
            served, "queue_timeout_ensemble", protocol, 0, 1.0
        )
    expected = (before[0] + 4, before[1] + 2)

    def counts() -> tuple[int, int]:
        return failures(served, "queue_timeout_ensemble", "OTHER"), failures(served, "queue_timeout", "REJECTED")

    wait_until(lambda: counts() == expected, 30, f"failure counts {expected}")


# -- item 10: ragged batching ----------------------------------------------------------------------------
def test_requests_of_different_shapes_form_one_ragged_batch(served):
    client = httpclient.InferenceServerClient(served.url, concurrency=3, network_timeout=60)
    pending = []
    for width in (2, 3, 4):
        tensor = httpclient.InferInput("X", [1, width], "FP32")
        tensor.set_data_from_numpy(np.ones((1, width), np.float32))
        pending.append(client.async_infer("ragged", [tensor]))
    assert [p.get_result().as_numpy("SUM").tolist() for p in pending] == [[[2.0]], [[3.0]], [[4.0]]]
    assert batch_sizes(client, "ragged") == {3: 1}  # one batch of the three, as its statistics say
    client.close()


# -- item 8: shared memory registered 1023 pages into a 1024-page key -----------------------------------
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_qa_large_shm_register_offset_on_the_generated_int32_model(served, protocol):
    """qa/L0_shared_memory test_large_shm_register_offset with iu.shm_basic_infer's pattern."""
    import tritonclient.utils.shared_memory as shm

    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(served.url if protocol == "http" else served.grpc_url)
    page = os.sysconf("SC_PAGE_SIZE")
    offset = page * 1023
    names = ["input0_data", "input1_data", "output0_data", "output1_data"]
    tag = f"{protocol}_{os.getpid()}"
    handles = [shm.create_shared_memory_region(n, f"/{n}_{tag}", page * 1024) for n in names]
    try:
        for name in names:
            client.register_system_shared_memory(name, f"/{name}_{tag}", 64, offset=offset)
        input0, input1 = np.arange(16, dtype=np.int32), np.ones(16, dtype=np.int32)
        shm.set_shared_memory_region(handles[0], [input0], offset=offset)
        shm.set_shared_memory_region(handles[1], [input1], offset=offset)
        inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory("input0_data", 64)
        inputs[1].set_shared_memory("input1_data", 64)
        if protocol == "http":
            outputs = [
                httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
                httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
            ]
        else:
            outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("output0_data", 64, offset=0)
        outputs[1].set_shared_memory("output1_data", 64, offset=0)
        # version 1 (what Triton's test.sh copies: `cp -r .../${model}/1`): OUTPUT0 = INPUT0 + INPUT1;
        # the latest, 3, is generated with swap=True: OUTPUT0 = INPUT0 - INPUT1, on Triton too
        added, subtracted = input0 + input1, input0 - input1
        for version, expected in (("1", (added, subtracted)), ("", (subtracted, added))):
            result = client.infer("onnx_int32_int32_int32", inputs, model_version=version, outputs=outputs)
            output = result.get_output("OUTPUT0")
            shape = output["shape"] if protocol == "http" else list(output.shape)
            for handle, values in zip(handles[2:], expected):
                np.testing.assert_array_equal(
                    shm.get_contents_as_numpy(handle, np.int32, shape, offset=offset)[0], values
                )
    finally:
        client.unregister_system_shared_memory()
        for handle in handles:
            shm.destroy_shared_memory_region(handle)
        client.close()


# -- item 15: priorities with queue policies ---------------------------------------------------------
def test_priority_levels_with_their_queue_policies_answer_within_tritons_bounds(served):
    """qa/L0_model_queue test_priority_with_policy, sent 0.2 s apart as there: (rows, priority,
    timeout). The 1-row priority-1 request times out at 1 s and is DELAYED behind its level, which
    makes the two 2-row priority-1 requests the preferred 4 at once; the 2-row priority-2 request
    is REJECTED at 2 s, which makes the delayed 1 and the 3 the next 4; the 6 waits for the delay.
    Bounds are Triton's (seconds after each send), the 10 s delay being 4 s here."""
    sends = [(2, 1, 0), (1, 1, 1_000_000), (2, 1, 0), (2, 2, 2_000_000), (3, 2, 0), (6, 2, 0)]
    bounds = [(1.0, 2.0), (2.4, 3.4), (0.7, 1.7), None, (1.7, 2.7), (4.0, 6.0)]
    results: dict[int, tuple[str, float]] = {}

    def send(index: int, rows: int, priority: int, timeout_us: int) -> None:
        client = httpclient.InferenceServerClient(served.url, network_timeout=60)
        tensor = httpclient.InferInput("INPUT0", [rows, 16], "FP32")
        tensor.set_data_from_numpy(np.zeros((rows, 16), np.float32))
        started = time.monotonic()
        try:
            client.infer("priority_policy", [tensor], priority=priority, timeout=timeout_us or None)
            results[index] = ("ok", time.monotonic() - started)
        except InferenceServerException as exc:
            results[index] = (exc.message(), time.monotonic() - started)
        finally:
            client.close()

    threads = [threading.Thread(target=send, args=(i, *spec)) for i, spec in enumerate(sends)]
    for thread in threads:
        thread.start()
        time.sleep(0.2)  # the scenario's spacing (Triton's), not a synchronisation: no result waits on it
    for thread in threads:
        thread.join(60)
    assert results[3][0].endswith("Request timeout expired"), results
    for index, bound in enumerate(bounds):
        if bound is not None:
            assert results[index][0] == "ok" and bound[0] <= results[index][1] < bound[1], (index, results)


def test_a_tensor_backend_gets_the_ragged_batch_flat_and_each_request_its_shape(served):
    """qa/L0_batcher test_multi_batch_different_shape_allow_ragged: [1, 16] and [1, 8] form one
    batch of 2 (the preferred size) on an onnx model with BATCH_SCATTER_WITH_INPUT_SHAPE."""
    client = httpclient.InferenceServerClient(served.url, concurrency=2, network_timeout=60)
    pending, sent = [], []
    for width in (16, 8):
        data = np.arange(width, dtype=np.float32).reshape(1, width) + width
        tensor = httpclient.InferInput("INPUT0", [1, width], "FP32")
        tensor.set_data_from_numpy(data)
        pending.append(client.async_infer("ragged_onnx", [tensor]))
        sent.append(data)
    for request, data in zip(pending, sent):
        np.testing.assert_array_equal(request.get_result().as_numpy("OUTPUT0"), data)
    assert batch_sizes(client, "ragged_onnx") == {2: 1}
    client.close()


def test_a_batch_input_tells_the_model_where_each_ragged_request_ends(served):
    """Issue 28 item 10: `batch_input { kind: BATCH_ACCUMULATED_ELEMENT_COUNT }` on a ragged input:
    requests of 16 and 8 elements form one batch of 2, and the model gets INDEX = [16, 24]."""
    client = httpclient.InferenceServerClient(served.url, concurrency=2, network_timeout=60)
    pending, sent = [], []
    for width in (16, 8):
        data = np.arange(width, dtype=np.float32).reshape(1, width)
        tensor = httpclient.InferInput("INPUT0", [1, width], "FP32")
        tensor.set_data_from_numpy(data)
        pending.append(client.async_infer("ragged_index", [tensor]))
        sent.append(data)
    results = [request.get_result() for request in pending]
    for result, data in zip(results, sent):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    assert [result.as_numpy("END").reshape(-1).tolist() for result in results] == [[16.0], [24.0]]
    assert batch_sizes(client, "ragged_index") == {2: 1}
    client.close()
