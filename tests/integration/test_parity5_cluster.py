"""Triton parity V (issue 48): NVIDIA's own examples run unchanged, against one cluster through
tritonclient. Texts and sources: docs/compatibility.md, "Parity V"."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.cluster import running_cluster
from tests.integration import stream_models


def _io(kind: str, name: str, datatype: str, dims: str) -> str:
    return f'{kind} [ {{ name: "{name}" data_type: {datatype} dims: [ {dims} ] }} ]\n'


def _python_model(root: Path, name: str, source: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(source)
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n' + config)


# -- item 1: python_backend's examples/bls and examples/bls_decoupled, what they do that matters --
ADD_SUB = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return out
"""
ADD_SUB_IO = "".join(
    _io(k, n, "TYPE_FP32", "4")
    for k, n in (("input", "INPUT0"), ("input", "INPUT1"), ("output", "OUTPUT0"), ("output", "OUTPUT1"))
)

# examples/bls/sync_model.py: the target's name is the MODEL_NAME input's element, a bytes object
BLS_BY_NAME = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            bls = pb_utils.InferenceRequest(
                model_name=name, requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[pb_utils.get_input_tensor_by_name(request, n) for n in ("INPUT0", "INPUT1")])
            response = bls.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            out.append(pb_utils.InferenceResponse(output_tensors=response.output_tensors()))
        return out
"""

# examples/decoupled/square_model.py: IN responses of OUT = IN, then the final flag alone
SQUARE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0]
            sender = request.get_response_sender()
            for _ in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([n], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
SQUARE_CONFIG = (
    _io("input", "IN", "TYPE_INT32", "1")
    + _io("output", "OUT", "TYPE_INT32", "1")
    + "model_transaction_policy { decoupled: true }\ninstance_group [{ kind: KIND_CPU }]\n"
)

# examples/bls_decoupled/sync_model.py: a plain `for` over exec(decoupled=True), an int64 sum
BLS_DECOUPLED_SYNC = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        bls = pb_utils.InferenceRequest(model_name="square_int32", requested_output_names=["OUT"],
                                        inputs=[pb_utils.get_input_tensor_by_name(requests[0], "IN")])
        total = np.array([0])
        for response in bls.exec(decoupled=True):
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            if len(response.output_tensors()) > 0:
                total += pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])]
"""

# examples/bls_decoupled/async_model.py: two async_exec(decoupled=True) gathered, each a plain `for`
BLS_DECOUPLED_ASYNC = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        num = pb_utils.get_input_tensor_by_name(requests[0], "IN")
        waits = [pb_utils.InferenceRequest(model_name="square_int32", inputs=[num],
                                           requested_output_names=["OUT"]).async_exec(decoupled=True)
                 for _ in range(2)]
        total = np.array([0])
        for responses in await asyncio.gather(*waits):
            for response in responses:
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if len(response.output_tensors()) > 0:
                    total += pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])]
"""
BLS_DECOUPLED_CONFIG = (
    _io("input", "IN", "TYPE_INT32", "1")
    + _io("output", "SUM", "TYPE_INT32", "1")
    + "instance_group [{ kind: KIND_CPU }]\n"
)


# -- item 6: a non-decoupled ensemble (its one step the python model "pre") ----------------------
PRE_ONLY = """name: "pre_only"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "pre" model_version: -1
  input_map { key: "X" value: "IN" } output_map { key: "Y" value: "OUT" } } ] }
"""

# and a decoupled one whose last (only) step sends its final flag alone
GEN_ONLY = """name: "gen_only"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "gen" model_version: -1
  input_map { key: "PROMPT" value: "IN" } output_map { key: "TOKEN" value: "TOKEN" } } ] }
"""

# a decoupled model sending the final flag with its last response, alone and as an ensemble's step
COUNT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            for i, value in enumerate(values):
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == len(values) - 1 else 0
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))]), flags)
        return None
"""
COUNT_CONFIG = (
    "max_batch_size: 0\n"
    + _io("input", "IN", "TYPE_INT32", "-1")
    + _io("output", "OUT", "TYPE_INT32", "1")
    + "model_transaction_policy { decoupled: true }\n"
)
COUNT_ONLY = """name: "count_only"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "count" model_version: -1
  input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "OUT" } } ] }
"""

# -- item 5: qa/L0_backend_python/model_readiness's test models (readiness_model.py,
# readiness_coroutine_model.py, is_ready_fn_returns_true_decoupled), what they do that matters
READINESS = """
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.value = params.get("READINESS_FN_RETURN_VALUE", {}).get("string_value", "true")
        self.delay = float(params.get("READINESS_FN_DELAY_SECS", {}).get("string_value", "0"))

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]

    def is_ready(self):
        time.sleep(self.delay)
        if self.value == "false":
            return False
        if self.value == "exception":
            raise RuntimeError("Internal check failed")
        if self.value == "non_boolean":
            return "ready"
        return True
"""
READINESS_COROUTINE = READINESS.replace("import time", "import asyncio").replace(
    "    def is_ready(self):\n        time.sleep(self.delay)",
    "    async def is_ready(self):\n        await asyncio.sleep(self.delay)",
)
READINESS_MODELS = [
    ("is_ready_fn_returns_true", "true", "0.1"),
    ("is_ready_fn_returns_false", "false", "0.1"),
    ("is_ready_fn_raises_error", "exception", "0.1"),
    ("is_ready_fn_returns_non_boolean", "non_boolean", "0.1"),
    ("is_ready_fn_timeout", "true", "8"),
    ("is_ready_fn_coroutine_returns_true", "coroutine", "0.1"),
]


def readiness_config(value: str, delay: str) -> str:
    return (
        "max_batch_size: 1\n"
        + _io("input", "INPUT0", "TYPE_FP32", "-1")
        + _io("output", "OUTPUT0", "TYPE_FP32", "-1")
        + "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        + f'parameters: {{ key: "READINESS_FN_RETURN_VALUE" value: {{ string_value: "{value}" }} }}\n'
        + f'parameters: {{ key: "READINESS_FN_DELAY_SECS" value: {{ string_value: "{delay}" }} }}\n'
    )


READINESS_DECOUPLED = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().item()
            sender = request.get_response_sender()
            for _ in range(count):
                time.sleep(0.1)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([count], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def is_ready(self):
        time.sleep(0.2)
        return True
"""
READINESS_DECOUPLED_CONFIG = (
    "max_batch_size: 1\n"
    + _io("input", "IN", "TYPE_INT32", "1")
    + _io("output", "OUT", "TYPE_INT32", "1")
    + "model_transaction_policy { decoupled: true }\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n"
)


def build_repository(root: Path) -> Path:
    _python_model(root, "add_sub", ADD_SUB, ADD_SUB_IO)
    _python_model(root, "bls_sync", BLS_BY_NAME, _io("input", "MODEL_NAME", "TYPE_STRING", "1") + ADD_SUB_IO)
    _python_model(root, "square_int32", SQUARE, SQUARE_CONFIG)
    _python_model(root, "bls_decoupled_sync", BLS_DECOUPLED_SYNC, BLS_DECOUPLED_CONFIG)
    _python_model(root, "bls_decoupled_async", BLS_DECOUPLED_ASYNC, BLS_DECOUPLED_CONFIG)
    stream_models.write_models(root)  # pre -> gen (decoupled) -> post: the decoupled ensemble "llm"
    for name, config in (("pre_only", PRE_ONLY), ("gen_only", GEN_ONLY), ("count_only", COUNT_ONLY)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    _python_model(root, "count", COUNT, COUNT_CONFIG)
    for name, value, delay in READINESS_MODELS:
        source = READINESS_COROUTINE if value == "coroutine" else READINESS
        _python_model(root, name, source, readiness_config(value, delay))
    _python_model(root, "is_ready_decoupled", READINESS_DECOUPLED, READINESS_DECOUPLED_CONFIG)
    return root


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = build_repository(tmp_path_factory.mktemp("parity5"))
    with running_cluster(root) as running:
        running.root = root
        yield running


def _client(served, protocol: str):
    if protocol == "http":
        return httpclient.InferenceServerClient(served.url, network_timeout=60)
    return grpcclient.InferenceServerClient(served.grpc_url)


def _inputs(module, arrays: dict[str, np.ndarray]) -> list:
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == np.object_ else {"float32": "FP32", "int32": "INT32"}[str(array.dtype)]
        tensor = module.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


# -- item 1 --------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_takes_the_targets_name_as_bytes(served, protocol):
    """examples/bls sync: MODEL_NAME's element (bytes) names the target, as python_backend takes it."""
    module = httpclient if protocol == "http" else grpcclient
    client = _client(served, protocol)
    a, b = np.random.rand(4).astype(np.float32), np.random.rand(4).astype(np.float32)
    name = np.array(["add_sub"], dtype=np.object_)
    result = client.infer("bls_sync", _inputs(module, {"MODEL_NAME": name, "INPUT0": a, "INPUT1": b}))
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b)
    client.close()


@pytest.mark.parametrize("model, copies", [("bls_decoupled_sync", 1), ("bls_decoupled_async", 2)])
def test_decoupled_bls_examples_sum_their_streams(served, model, copies):
    """examples/bls_decoupled: exec(decoupled=True) and async_exec(decoupled=True) give iterators
    a plain `for` reads (the final flag alone arrives as an empty response); the model's INT64 sum
    goes out as INT64 though its config says INT32, as python_backend sends it."""
    client = _client(served, "http")
    for value in (4, 2, 0, 1):
        result = client.infer(model, _inputs(httpclient, {"IN": np.array([value], np.int32)}))
        output = result.as_numpy("SUM")
        assert output.dtype == np.int64 and output.tolist() == [copies * value * value]
    client.close()


# -- item 4: qa/L0_backend_identity (test.sh's models, identity_test.py's checks, its log counts) --
IDENTITY_FP32 = """name: "identity_fp32"
backend: "identity"
max_batch_size: 1
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind : KIND_CPU } ]
"""


def identity_repository(root: Path) -> Path:
    """test.sh's all_models: identity_fp32 and its sed-made copies."""
    variants = {
        "identity_fp32": IDENTITY_FP32,
        "identity_bytes": IDENTITY_FP32.replace("TYPE_FP32", "TYPE_STRING"),
        "identity_nobatch_int8": IDENTITY_FP32.replace("TYPE_FP32", "TYPE_INT8").replace(
            "max_batch_size: 1", "max_batch_size: 0"
        ),
        "identity_uint32": IDENTITY_FP32.replace("TYPE_FP32", "TYPE_UINT32").replace(
            "max_batch_size: 1", "max_batch_size: 8"
        )
        + "dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 3000000 }\n",
        "identity_bf16": IDENTITY_FP32.replace("TYPE_FP32", "TYPE_BF16"),
    }
    for name, config in variants.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config.replace('name: "identity_fp32"', f'name: "{name}"'))
    return root


def _metric(text: str, prefix: str) -> float | None:
    return next((float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)), None)


def test_l0_backend_identity(tmp_path):
    """identity_test.py for http then grpc, then test.sh's count of `byte_size = N` log lines."""
    import ml_dtypes
    import requests
    from tritonclient.utils import np_to_triton_dtype

    from tests.serving import Serve, wait_until

    serve = Serve(
        tmp_path / "serve", [f"--model-repository={identity_repository(tmp_path / 'models')}", "--log-verbose=1"]
    )
    serve.start()
    try:
        # http's async part: 4 requests of [2, 2] run as one batch of 8; 4 * 16 input bytes counted
        with httpclient.InferenceServerClient(serve.url, concurrency=4) as client:
            datas = [(16384 * np.random.randn(2, 2)).astype(np.uint32) for _ in range(4)]
            pending = []
            for data in datas:
                tensor = httpclient.InferInput("INPUT0", list(data.shape), "UINT32")
                tensor.set_data_from_numpy(data)
                pending.append(client.async_infer("identity_uint32", [tensor]))
            for data, request in zip(datas, pending):
                np.testing.assert_array_equal(request.get_result().as_numpy("OUTPUT0"), data)
            [stat] = client.get_inference_statistics("identity_uint32")["model_stats"]
            assert (stat["inference_count"], stat["execution_count"]) == (8, 1)
            metrics = requests.get(f"http://127.0.0.1:{serve.metrics_port}/metrics", timeout=30).text
            labels = '{model="identity_uint32",version="1"}'
            assert _metric(metrics, f"nv_inference_request_success{labels}") == 4
            assert _metric(metrics, f"nv_inference_count{labels}") == 8
            assert _metric(metrics, f"nv_inference_exec_count{labels}") == 1

            def counted() -> bool:  # the worker publishes its custom metrics with its heartbeats
                text = requests.get(f"http://127.0.0.1:{serve.metrics_port}/metrics", timeout=30).text
                return _metric(text, f"input_byte_size_counter{labels}") == 64

            wait_until(counted, 30, "input_byte_size_counter 64")
        cases = [
            ("identity_fp32", np.float32, [1, 0]),
            ("identity_fp32", np.float32, [1, 5]),
            ("identity_uint32", np.uint32, [4, 0]),
            ("identity_uint32", np.uint32, [8, 5]),
            ("identity_nobatch_int8", np.int8, [0]),
            ("identity_nobatch_int8", np.int8, [7]),
            ("identity_bytes", object, [1, 1]),
            ("identity_bf16", ml_dtypes.bfloat16, [1, 0]),
            ("identity_bf16", ml_dtypes.bfloat16, [1, 5]),
        ]
        for module, url in ((httpclient, serve.url), (grpcclient, f"127.0.0.1:{serve.grpc_port}")):
            client = module.InferenceServerClient(url)
            for model, dtype, shape in cases:
                if dtype is object:
                    data = np.array([str(x) for x in (16384 * np.ones(shape, dtype=int)).flatten()], dtype=object)
                    data = data.reshape(shape)
                else:
                    data = (16384 * np.random.randn(*shape)).astype(dtype)
                tensor = module.InferInput("INPUT0", list(data.shape), np_to_triton_dtype(data.dtype))
                tensor.set_data_from_numpy(data)
                result = client.infer(model, [tensor])
                output = result.as_numpy("OUTPUT0")
                if dtype is object:
                    output = np.array([str(x, encoding="utf-8") for x in output.flatten()], dtype=object).reshape(
                        output.shape
                    )
                assert output.dtype == data.dtype and np.array_equal(output, data), model
                params = result.get_response()["parameters"] if module is httpclient else None
                if module is grpcclient:
                    raw = result.get_response().parameters
                    params = {
                        "param0": raw["param0"].string_param,
                        "param1": raw["param1"].int64_param,
                        "param2": raw["param2"].bool_param,
                        "param3": raw["param3"].double_param,
                    }
                assert params == {
                    "param0": "an example string parameter",
                    "param1": 42,
                    "param2": False,
                    "param3": 123.123,
                }
            client.close()
    finally:
        serve.terminate(60)
    log = serve.log()
    for text, count in (
        ("byte_size = 0,", 8),
        ("byte_size = 7,", 2),
        ("byte_size = 16", 6),  # 16 and 160, as test.sh's grep counts them
        ("byte_size = 20,", 2),
        ("byte_size = 160,", 2),
    ):
        assert log.count(text) == count, (text, log.count(text))


# -- item 6 --------------------------------------------------------------------------------------
def _stream(served, model: str, values: list[int], empty_final: bool, requests: int = 1) -> list:
    """tritonclient.grpc's stream as a client waiting for the final flag uses it: every response
    until each request's `triton_final_response`, with a deadline."""
    import queue

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(served.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for i in range(requests):
            name = {"pre": "X", "gen": "PROMPT"}.get(model, "IN")
            tensor = grpcclient.InferInput(name, [len(values)], "INT32")
            tensor.set_data_from_numpy(np.array(values, np.int32))
            client.async_stream_infer(model, [tensor], request_id=str(i), enable_empty_final_response=empty_final)
        got, finals = [], 0
        while finals < requests:
            item = answers.get(timeout=30)  # a stream that never says final fails here
            assert not isinstance(item, Exception), str(item)
            response = item.get_response()
            got.append(response)
            finals += response.parameters["triton_final_response"].bool_param
        return got
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("model", ["llm", "llm_outer", "gen_only", "gen"])
def test_a_decoupled_stream_ends_with_the_final_flag(served, model):
    """gen sends its final flag alone. gen, and gen_only (gen still in flight when its last token's
    response goes): an empty final response says it, with enable_empty_final_response. llm: the
    last token's postprocess may end after gen did, and then its response is the final one, as
    Triton's ensemble (FinishEnsemble) marks a response made with no step left in flight."""
    got = _stream(served, model, [1, 2, 3], True)
    finals = [r.parameters["triton_final_response"].bool_param for r in got]
    data = [r for r in got if r.outputs]
    assert len(data) == 3 and finals[-1] and not any(finals[:-1])
    if model in ("gen", "gen_only"):
        assert len(got) == 4 and not got[-1].outputs
    assert len(got) == 3 or not got[-1].outputs


@pytest.mark.parametrize("empty_final", [True, False])
@pytest.mark.parametrize("model", ["pre_only", "pre"])
def test_a_non_decoupled_model_or_ensemble_answers_final_on_a_stream(served, model, empty_final):
    got = _stream(served, model, [1, 2], empty_final, requests=2)
    assert len(got) == 2 and all(r.parameters["triton_final_response"].bool_param for r in got)
    for response in got:
        assert grpcclient.InferResult(response).as_numpy(response.outputs[0].name).tolist() == [2, 3]


@pytest.mark.parametrize("empty_final", [True, False])
@pytest.mark.parametrize("model", ["count", "count_only"])
def test_a_last_response_sent_final_ends_the_stream(served, model, empty_final):
    """A decoupled step that sends its final flag with its last response: through an ensemble too
    that response is the final one (before: an empty final followed, and a client without
    enable_empty_final_response never saw the final flag and waited to its timeout)."""
    got = _stream(served, model, [1, 2, 3], empty_final, requests=2)
    assert len(got) == 6 and all(r.outputs for r in got)
    for request in ("0", "1"):
        finals = [r.parameters["triton_final_response"].bool_param for r in got if r.id == request]
        assert finals == [False, False, True]


# -- item 5 --------------------------------------------------------------------------------------
def _identity_infer(client, module, model: str) -> None:
    data = np.ones((1, 8), np.float32)
    tensor = module.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer(model, [tensor]).as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize(
    "model, ready",
    [
        ("is_ready_fn_returns_true", True),
        ("is_ready_fn_returns_false", False),
        ("is_ready_fn_raises_error", False),
        ("is_ready_fn_returns_non_boolean", False),
        ("is_ready_fn_coroutine_returns_true", True),
    ],
)
def test_a_python_models_is_ready_answers_each_readiness_request(served, model, ready):
    """test_model_readiness.py's TestUserDefinedModelReadinessFunction: every readiness request
    over HTTP and gRPC asks is_ready() (an exception or a result not a bool: not ready), and
    inference is unaffected either way."""
    http, grpc = _client(served, "http"), _client(served, "grpc")
    for _ in range(3):
        assert http.is_model_ready(model) is ready
        assert grpc.is_model_ready(model) is ready
        _identity_infer(http, httpclient, model)
        _identity_infer(grpc, grpcclient, model)
    http.close()
    grpc.close()


def test_a_slow_is_ready_is_not_ready_then_the_next_request_waits_for_it(served):
    """test_is_ready_takes_long_time: is_ready() sleeps 8 s; the first request gives up at 5 s
    (not ready), the next waits for the check in flight and is ready."""
    http, grpc = _client(served, "http"), _client(served, "grpc")
    assert http.is_model_ready("is_ready_fn_timeout") is False
    _identity_infer(http, httpclient, "is_ready_fn_timeout")
    assert grpc.is_model_ready("is_ready_fn_timeout") is True
    http.close()
    grpc.close()


def test_is_ready_answers_while_a_decoupled_execute_runs(served):
    """test_multiple_concurrent_ready_and_infer_requests_decoupled, smaller: readiness requests
    answer (ready) while the model's execute is streaming, not after it."""
    import queue
    import threading

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(served.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[40]], np.int32))  # 40 responses, 0.1 s apart
        client.async_stream_infer("is_ready_decoupled", [tensor])
        first = answers.get(timeout=30)
        assert not isinstance(first, Exception), str(first)
        results: list[bool] = []

        def ask() -> None:
            with grpcclient.InferenceServerClient(served.grpc_url) as other:
                results.append(other.is_model_ready("is_ready_decoupled"))

        threads = [threading.Thread(target=ask) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert results == [True] * 4
        # answered while execute still streams (before: is_ready queued behind it on the instance's thread)
        assert 1 + answers.qsize() < 40
        for _ in range(39):
            item = answers.get(timeout=30)
            assert not isinstance(item, Exception), str(item)
    finally:
        client.stop_stream()
        client.close()
