"""Triton parity III (issue 28) behaviours against one cluster on a repository of their models,
through tritonclient. Texts and sources: docs/compatibility.md."""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running_cluster(build_repository(tmp_path_factory.mktemp("parity3"))) as running:
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
def timed_infer(running, model: str, protocol: str, rows: int, timeout_us: int, results: dict, key: str) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(running.url if protocol == "http" else running.grpc_url)
    tensor = module.InferInput("INPUT0", [rows, 16], "FP32")
    tensor.set_data_from_numpy(np.zeros((rows, 16), np.float32))
    started = time.monotonic()
    try:
        client.infer(model, [tensor], timeout=timeout_us or None)
        results[key] = ("ok", time.monotonic() - started)
    except InferenceServerException as exc:
        results[key] = (exc.message(), time.monotonic() - started)
    finally:
        client.close()


@pytest.mark.parametrize("model", ["queue_timeout", "queue_timeout_ensemble"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("first_timeout_us, runs_after_s", [(100_000, 0.0), (10_000_000, 0.7), (0, 0.7)])
def test_a_request_timeout_shortens_the_default_only_and_fails_only_its_request(
    served, model, protocol, first_timeout_us, runs_after_s
):
    """qa/L0_model_queue test_timeout_override: a 1-row request, then (0.2 s later) two 2-row
    requests. The 1 times out alone (its 100 ms, or the 1 s default: a longer timeout does not
    extend it); the two 2s then form the preferred 4 and run at once, long before the 10 s delay."""
    results: dict = {}
    args = (served, model, protocol)
    first = threading.Thread(target=timed_infer, args=(*args, 1, first_timeout_us, results, "first"))
    first.start()
    time.sleep(0.2)  # the order of arrival is the scenario, as in Triton's test; no result waits on it
    others = [threading.Thread(target=timed_infer, args=(*args, 2, 0, results, k)) for k in ("a", "b")]
    for thread in others:
        thread.start()
    for thread in (first, *others):
        thread.join(60)
    assert results["first"][0].endswith("Request timeout expired"), results
    assert [results[k][0] for k in ("a", "b")] == ["ok", "ok"], results
    for key in ("a", "b"):
        assert runs_after_s <= results[key][1] < 5.0, results  # the delay is 10 s


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
            served, "queue_timeout_ensemble", protocol, 0, 0.7
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
