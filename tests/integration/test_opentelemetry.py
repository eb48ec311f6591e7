"""OpenTelemetry tracing across services (issue 38 item 8; docs/serving.md, "Tracing").

One cluster of three processes: a gateway, a standalone scheduler and a worker (the python
models in processes of their own), each exporting its spans over OTLP/HTTP to a receiver this
test starts on a free port, which decodes them with the official opentelemetry-proto messages.
Checked: Triton's span shape (InferRequest > <model> > compute, their events and attributes),
the client's W3C context honoured over HTTP and gRPC, and beyond Triton the scheduler's `queue`
and `batch` spans and the parent/child links across the processes, an ensemble's steps and a BLS
call of a python model.
"""

from __future__ import annotations

import json
import re
import secrets
import textwrap

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from services.repository import examples
from tests.cluster import running_cluster

pytest.importorskip("opentelemetry.sdk", reason="the tracing tests need the otel extra: pip install 'shoal[otel]'")
from tests.otlp import OtlpReceiver, ReceivedSpan  # noqa: E402 (needs opentelemetry-proto)

CLIENT_SPAN = "b7ad6b7169242424"


def client_context() -> tuple[str, str]:
    """A client's trace id and its `traceparent` header (a trace of its own for each test)."""
    trace_id = secrets.token_hex(16)
    return trace_id, f"00-{trace_id}-{CLIENT_SPAN}-01"


ENSEMBLE = """name: "ensemble_add_sub"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
ensemble_scheduling { step [ {
  model_name: "simple" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" }
} ] }
"""

# qa/python_models/bls_simple, as Triton's trace tests use it: the BLS request passes its trace
BLS_SIMPLE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            call = pb_utils.InferenceRequest(
                model_name=name.decode() if isinstance(name, bytes) else str(name),
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(request, "INPUT1")],
                trace=request.trace(),
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=answer.output_tensors()))
        return responses
"""
BLS_CONFIG = """name: "bls_simple"
backend: "python"
max_batch_size: 0
input [
  { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1, 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 1, 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1, 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 1, 16 ] }
]
"""

# qa/L0_trace/trace_context.py: the request's context as the python backend shows it
TRACE_CONTEXT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            context = request.trace().get_context()
            out = pb_utils.Tensor("OUTPUT0", np.array([context or ""], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""
TRACE_CONTEXT_CONFIG = """name: "trace_context"
backend: "python"
max_batch_size: 0
input [ { name: "expect_none" data_type: TYPE_BOOL dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def _python(root, name: str, source: str, config: str) -> None:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(textwrap.dedent(source))
    (folder / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    root = tmp_path_factory.mktemp("otel-models")
    examples.write_model(root, "simple", examples.simple_graph(), examples.SIMPLE_CONFIG)
    (root / "ensemble_add_sub" / "1").mkdir(parents=True)
    (root / "ensemble_add_sub" / "config.pbtxt").write_text(ENSEMBLE)
    _python(root, "bls_simple", BLS_SIMPLE, BLS_CONFIG)
    _python(root, "trace_context", TRACE_CONTEXT, TRACE_CONTEXT_CONFIG)
    with OtlpReceiver() as receiver:
        config = [
            "mode=opentelemetry",
            f"opentelemetry,url={receiver.url}",
            "opentelemetry,resource=test.key=test.value",
            "opentelemetry,bsp_schedule_delay=50",
        ]
        with running_cluster(
            root,
            shape="standalone",
            scheduler={"trace_config": config},  # the gateway's settings take the scheduler's too
            worker={"trace_config": config},
            trace_level="TIMESTAMPS",
            trace_rate=1,
        ) as running:
            yield running, receiver


def _inputs(module) -> list:
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(x)
    return inputs


def _spans_of(receiver: OtlpReceiver, request_id: str, count: int) -> list[ReceivedSpan]:
    """The spans of the one trace whose model span has this request id, once `count` arrived."""

    def trace_of(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        ids = {s.trace_id for s in spans if s.attributes.get("triton.request_id") == request_id}
        return [s for s in spans if s.trace_id in ids]

    return trace_of(receiver.wait_for(lambda spans: len(trace_of(spans)) >= count))


def _tree(spans: list[ReceivedSpan]) -> dict[str, list[str]]:
    """parent name -> sorted child names (Triton's `_verify_nesting`)."""
    names = {s.span_id: s.name for s in spans}
    tree: dict[str, list[str]] = {}
    for span in spans:
        if span.parent_span_id in names:
            tree.setdefault(names[span.parent_span_id], []).append(span.name)
    return {parent: sorted(children) for parent, children in tree.items()}


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def test_http_request_with_context_spans_gateway_scheduler_and_worker(traced):
    running, receiver = traced
    client = httpclient.InferenceServerClient(running.url)
    client_trace, traceparent = client_context()
    client.infer("simple", _inputs(httpclient), request_id="http-1", headers={"traceparent": traceparent})
    spans = _spans_of(receiver, "http-1", 5)
    assert sorted(s.name for s in spans) == ["InferRequest", "batch", "compute", "queue", "simple"]
    assert _tree(spans) == {"InferRequest": ["simple"], "simple": ["batch", "compute", "queue"]}
    root, model = _one(spans, "InferRequest"), _one(spans, "simple")
    # the client's context: same trace, the root's parent is the client's span
    assert root.trace_id == client_trace and root.parent_span_id == CLIENT_SPAN
    # Triton's events and attributes
    assert model.event_names == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert model.attributes["triton.model_name"] == "simple" and model.attributes["triton.model_version"] == 1
    compute = _one(spans, "compute")
    assert compute.event_names == ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    assert "INFER_RESPONSE_COMPLETE" in root.event_names
    # three processes: each exported its own spans
    assert {s.name: s.service for s in spans} == {
        "InferRequest": "gateway",
        "simple": "gateway",
        "queue": "scheduler",
        "batch": "scheduler",
        "compute": "worker",
    }
    assert len({s.resource["service.instance.id"] for s in spans}) == 3
    for span in spans:  # tritonserver's resource, plus `resource=` settings
        assert span.resource["service.name"] == "triton-inference-server"
        assert span.resource["test.key"] == "test.value"
    # the batch: why it was sent, and a link to each traced request's span in it
    batch, queue = _one(spans, "batch"), _one(spans, "queue")
    assert batch.attributes["shoal.batch.reason"] and batch.attributes["shoal.batch.requests"] == 1
    assert (model.trace_id, model.span_id) in batch.links
    assert (batch.trace_id, batch.span_id) in queue.links and queue.event_names == ["QUEUE_START"]
    # nesting in time: the gateway's span holds the scheduler's and the worker's (one host, one clock)
    for inner in (queue, compute):
        assert model.start_ns <= inner.start_ns <= inner.end_ns <= model.end_ns


def test_grpc_request_without_context_is_sampled_by_rate(traced):
    running, receiver = traced
    client = grpcclient.InferenceServerClient(running.grpc_url)
    client.infer("simple", _inputs(grpcclient), request_id="grpc-1")
    spans = _spans_of(receiver, "grpc-1", 5)
    root = _one(spans, "InferRequest")
    assert root.parent_span_id == ""
    assert "GRPC_WAITREAD_END" in root.event_names
    assert _tree(spans)["simple"] == ["batch", "compute", "queue"]


def test_grpc_context_in_metadata_is_honoured(traced):
    running, receiver = traced
    client = grpcclient.InferenceServerClient(running.grpc_url)
    client_trace, traceparent = client_context()
    client.infer("simple", _inputs(grpcclient), request_id="grpc-2", headers={"traceparent": traceparent})
    root = _one(_spans_of(receiver, "grpc-2", 5), "InferRequest")
    assert root.trace_id == client_trace and root.parent_span_id == CLIENT_SPAN


def test_ensemble_steps_are_model_spans_under_the_ensemble(traced):
    running, receiver = traced
    client = httpclient.InferenceServerClient(running.url)
    client.infer("ensemble_add_sub", _inputs(httpclient), request_id="ens-1")
    spans = _spans_of(receiver, "ens-1", 6)
    # Triton: InferRequest > ensemble > simple > compute; Shoal adds the scheduler's spans of the
    # step's batch (an ensemble never queues as itself: its scheduler runs the graph)
    assert _tree(spans) == {
        "InferRequest": ["ensemble_add_sub"],
        "ensemble_add_sub": ["simple"],
        "simple": ["batch", "compute", "queue"],
    }
    step = next(s for s in spans if s.name == "simple")
    assert step.service == "scheduler" and step.event_names == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]


def test_bls_call_is_a_child_of_the_calling_request(traced):
    running, receiver = traced
    client = httpclient.InferenceServerClient(running.url)
    inputs = _inputs(httpclient)
    name = httpclient.InferInput("MODEL_NAME", [1], "BYTES")
    name.set_data_from_numpy(np.array([b"simple"], dtype=np.object_))
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    client_trace, traceparent = client_context()
    result = client.infer("bls_simple", [name, *inputs], request_id="bls-1", headers={"traceparent": traceparent})
    assert (result.as_numpy("OUTPUT0") == x + x).all()
    spans = _spans_of(receiver, "bls-1", 9)
    tree = _tree(spans)
    # Triton: bls_simple > [compute, simple], simple > compute
    assert tree["InferRequest"] == ["bls_simple"]
    assert tree["bls_simple"] == ["batch", "compute", "queue", "simple"]
    assert tree["simple"] == ["batch", "compute", "queue"]
    called = [s for s in spans if s.name == "simple"]
    assert len(called) == 1 and called[0].service == "worker"  # the python model's process called it
    assert all(s.trace_id == client_trace for s in spans)


def test_trace_context_is_exposed_to_the_python_backend(traced):
    running, receiver = traced
    client = httpclient.InferenceServerClient(running.url)
    flag = httpclient.InferInput("expect_none", [1], "BOOL")
    flag.set_data_from_numpy(np.array([False]))
    client_trace, traceparent = client_context()
    result = client.infer("trace_context", [flag], headers={"traceparent": traceparent})
    context = json.loads(result.as_numpy("OUTPUT0")[0].decode())
    assert re.fullmatch(rf"00-{client_trace}-[0-9a-f]{{16}}-01", context["traceparent"])


def test_trace_settings_in_opentelemetry_mode(traced):
    running, receiver = traced
    settings = requests.get(f"http://{running.url}/v2/trace/setting", timeout=10).json()
    assert settings["trace_mode"] == "opentelemetry"
    assert settings["url"] == receiver.url and settings["resource"] == "test.key=test.value"
    assert settings["bsp_schedule_delay"] == "50"
    assert settings["bsp_max_queue_size"] == "2048" and settings["bsp_max_export_batch_size"] == "512"
    assert "trace_file" not in settings and "log_frequency" not in settings
    grpc_settings = grpcclient.InferenceServerClient(running.grpc_url).get_trace_settings(as_json=True)
    assert grpc_settings["settings"]["trace_mode"]["value"] == ["opentelemetry"]
