"""Triton parity V (issue 48, item 1): the metrics since Triton 2.51 as qa/L0_metrics checks them,
against a real cluster, through tritonclient and `/metrics`: the time-to-first-response histogram
of a decoupled model, a non-decoupled one and the ensemble of both (histogram_metrics_test.py
`test_ensemble_decoupled`), a model's own buckets (`test_buckets_override`), and the model load
time gauge (general_metrics_test.py)."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.cluster import running_cluster
from tests.serving import wait_until

HISTOGRAM = "nv_inference_first_response_histogram_ms"
WAIT_S = 0.3  # Triton's test waits 1 s per response; shorter here, the same shape
RESPONSES = 3
ITERATIONS = 2
SLACK_MS = 1500  # per request, over what the model waits: a busy 2-core machine (Triton allows 200 ms)

# as qa/L0_metrics' model: RESPONSE_NUM responses, each after WAIT_SECONDS, the last one final;
# decoupled or not, the same source (Triton's test strips the transaction policy from a copy; the
# non-decoupled copy gets RESPONSE_NUM 1 in the ensemble and sends its one response with the final flag)
WAIT_MODEL = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        request = requests[0]
        wait = pb_utils.get_input_tensor_by_name(request, "WAIT_SECONDS").as_numpy()[0]
        count = pb_utils.get_input_tensor_by_name(request, "RESPONSE_NUM").as_numpy()[0]
        outputs = [pb_utils.Tensor("WAIT_SECONDS", np.array([wait], np.float32)),
                   pb_utils.Tensor("RESPONSE_NUM", np.array([1], np.uint8))]
        sender = request.get_response_sender()
        for i in range(count):
            time.sleep(float(wait))
            last = i == count - 1
            sender.send(pb_utils.InferenceResponse(outputs),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
        return None
"""
# Shoal's case beyond Triton's test: the responses come from a thread the model starts, after
# `execute` returned (as an LLM engine's do): the worker tells the scheduler of the first one later
THREAD_MODEL = """
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT_SECONDS").as_numpy()[0]
            count = pb_utils.get_input_tensor_by_name(request, "RESPONSE_NUM").as_numpy()[0]
            args = (request.get_response_sender(), float(wait), int(count))
            threading.Thread(target=self._respond, args=args, daemon=True).start()
        return None

    def _respond(self, sender, wait, count):
        outputs = [pb_utils.Tensor("WAIT_SECONDS", np.array([wait], np.float32)),
                   pb_utils.Tensor("RESPONSE_NUM", np.array([1], np.uint8))]
        for i in range(count):
            time.sleep(wait)
            last = i == count - 1
            sender.send(pb_utils.InferenceResponse(outputs),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
"""
IO = """
input [ { name: "WAIT_SECONDS" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "RESPONSE_NUM" data_type: TYPE_UINT8 dims: [ 1 ] } ]
output [ { name: "WAIT_SECONDS" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "RESPONSE_NUM" data_type: TYPE_UINT8 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU } ]
"""
OVERRIDE = """
model_metrics {
  metric_control: [
    {
      metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
      histogram_options: { buckets: [ -1, 0.0, 1, 2.5 ] }
    }
  ]
}
"""
ENSEMBLE = """
name: "ensemble"
platform: "ensemble"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "INPUT1" data_type: TYPE_UINT8 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "async_execute_decouple" model_version: 1
    input_map { key: "WAIT_SECONDS" value: "INPUT0" } input_map { key: "RESPONSE_NUM" value: "INPUT1" }
    output_map { key: "WAIT_SECONDS" value: "temp_output0" } output_map { key: "RESPONSE_NUM" value: "temp_output1" } },
  { model_name: "async_execute" model_version: 1
    input_map { key: "WAIT_SECONDS" value: "temp_output0" } input_map { key: "RESPONSE_NUM" value: "temp_output1" }
    output_map { key: "WAIT_SECONDS" value: "OUTPUT" } }
] }
"""


def _python(root: Path, name: str, config: str, source: str = WAIT_MODEL) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(source)
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n{IO}{config}')


def build_repository(root: Path) -> Path:
    _python(root, "async_execute_decouple", "model_transaction_policy { decoupled: True }\n")
    _python(root, "async_execute", "")  # the same source, not decoupled: one response through its sender
    _python(root, "threaded_decouple", "model_transaction_policy { decoupled: True }\n", THREAD_MODEL)
    _python(root, "overridden", "model_transaction_policy { decoupled: True }\n" + OVERRIDE)
    (root / "ensemble" / "1").mkdir(parents=True)
    (root / "ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    return root


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = build_repository(tmp_path_factory.mktemp("parity5_metrics"))
    explicit = {"model_control_mode": "explicit", "load_model": ["*"]}
    with running_cluster(root, repository=explicit, histogram_latencies=True) as running:
        yield running


def _metrics(served) -> str:
    with urllib.request.urlopen(served.metrics_url, timeout=10) as response:
        return response.read().decode()


def _samples(text: str, family: str) -> dict[str, int]:
    """As Triton's test reads them: each line of the family, split at its last space, an int."""
    return {key: int(value) for key, value in (m.rsplit(" ") for m in re.findall(f"^{family}.*", text, re.MULTILINE))}


def _stream(served, model: str, inputs: list) -> list:
    answers: list = []
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.append(error or result))
        client.async_stream_infer(model_name=model, inputs=inputs)
        client.stop_stream()  # waits for the stream's end (the final flag)
    return answers


def _wait_inputs(wait_s: float, responses: int) -> list:
    inputs = [grpcclient.InferInput("INPUT0", [1], "FP32"), grpcclient.InferInput("INPUT1", [1], "UINT8")]
    inputs[0].set_data_from_numpy(np.array([wait_s], np.float32))
    inputs[1].set_data_from_numpy(np.array([responses], np.uint8))
    return inputs


def _check(histogram: dict[str, int], model: str, requests: int, wait_ms: float) -> None:
    labels = f'{{model="{model}",version="1"}}'
    assert histogram[f"{HISTOGRAM}_count{labels}"] == requests, model
    total = histogram[f"{HISTOGRAM}_sum{labels}"]
    assert wait_ms * requests <= total < (wait_ms + SLACK_MS) * requests, (model, total)


def test_first_response_of_a_decoupled_ensemble_and_its_steps(served):
    for _ in range(ITERATIONS):
        answers = _stream(served, "ensemble", _wait_inputs(WAIT_S, RESPONSES))
        assert len(answers) == RESPONSES and not any(isinstance(a, Exception) for a in answers), [
            str(a) for a in answers
        ]
    histogram = _samples(_metrics(served), HISTOGRAM)
    wait_ms = WAIT_S * 1000
    _check(histogram, "ensemble", ITERATIONS, 2 * wait_ms)  # its first answer: both steps' first
    _check(histogram, "async_execute_decouple", ITERATIONS, wait_ms)  # its first of three
    _check(histogram, "async_execute", RESPONSES * ITERATIONS, wait_ms)  # non-decoupled: each request
    # Triton's default buckets: all of them took over 100 ms and under 2 s
    labels = 'model="async_execute",version="1"'
    assert histogram[f'{HISTOGRAM}_bucket{{{labels},le="100"}}'] == 0
    assert histogram[f'{HISTOGRAM}_bucket{{{labels},le="2000"}}'] == RESPONSES * ITERATIONS
    assert histogram[f'{HISTOGRAM}_bucket{{{labels},le="+Inf"}}'] == RESPONSES * ITERATIONS


def test_first_response_sent_from_a_thread_after_execute(served):
    for _ in range(ITERATIONS):
        inputs = [
            grpcclient.InferInput("WAIT_SECONDS", [1], "FP32"),
            grpcclient.InferInput("RESPONSE_NUM", [1], "UINT8"),
        ]
        inputs[0].set_data_from_numpy(np.array([WAIT_S], np.float32))
        inputs[1].set_data_from_numpy(np.array([RESPONSES], np.uint8))
        answers = _stream(served, "threaded_decouple", inputs)
        assert len(answers) == RESPONSES and not any(isinstance(a, Exception) for a in answers)
    histogram = _samples(_metrics(served), HISTOGRAM)
    _check(histogram, "threaded_decouple", ITERATIONS, WAIT_S * 1000)  # each request's first of three, once


def test_a_models_own_buckets(served):
    answers = _stream_direct(served, "overridden")
    assert len(answers) == 2
    # the first response's time reaches the scheduler with the request's completion, which the
    # worker sends after the stream's final response: the client may read /metrics before it
    infinity = f'{HISTOGRAM}_bucket{{model="overridden",version="1",le="+Inf"}} 1'
    wait_until(lambda: infinity in _metrics(served), 10, "the stream in the histogram")
    text = _metrics(served)
    lines = [line for line in text.splitlines() if line.startswith(f'{HISTOGRAM}_bucket{{model="overridden"')]
    assert len(lines) == 5  # Triton's check: as many `_bucket` lines as OVERRIDE_BUCKETS="-1,0,1,2.5,+Inf"
    for le in ("-1", "0", "1", "2.5", "+Inf"):
        assert f'{HISTOGRAM}_bucket{{model="overridden",version="1",le="{le}"}}' in text
    histogram = _samples(text, HISTOGRAM)
    assert histogram[f'{HISTOGRAM}_bucket{{model="overridden",version="1",le="2.5"}}'] == 0  # 50 ms and more
    assert histogram[f'{HISTOGRAM}_bucket{{model="overridden",version="1",le="+Inf"}}'] == 1


def _stream_direct(served, model: str) -> list:
    inputs = [grpcclient.InferInput("WAIT_SECONDS", [1], "FP32"), grpcclient.InferInput("RESPONSE_NUM", [1], "UINT8")]
    inputs[0].set_data_from_numpy(np.array([0.05], np.float32))
    inputs[1].set_data_from_numpy(np.array([2], np.uint8))
    return _stream(served, model, inputs)


def _load_times(text: str) -> dict[str, dict[str, float]]:
    """As general_metrics_test.py reads them: model -> version -> seconds."""
    found: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = re.match(r"nv_model_load_duration_secs\{model=\"(.*?)\",version=\"(.*?)\"\} (.*)", line)
        if match:
            found.setdefault(match.group(1), {})[match.group(2)] = float(match.group(3))
    return found


def test_the_load_time_of_each_loaded_model_goes_with_its_unload(served):
    times = _load_times(_metrics(served))
    for model in ("async_execute_decouple", "async_execute", "overridden", "threaded_decouple"):
        assert 0 < times[model]["1"] < 60, times
    client = httpclient.InferenceServerClient(served.url, network_timeout=60)
    try:
        # loaded already, unchanged: Triton keeps it (and its time); Shoal loads it again, a new time
        client.load_model("async_execute")
        assert 0 < _load_times(_metrics(served))["async_execute"]["1"] < 60
        client.unload_model("overridden")
        assert "overridden" not in _load_times(_metrics(served))
    finally:
        client.load_model("overridden")
        client.close()
