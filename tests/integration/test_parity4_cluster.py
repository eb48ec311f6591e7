"""Triton parity IV (issue 38) behaviours against one cluster on a repository of Triton's qa
models, through tritonclient. Texts and sources: docs/compatibility.md, "Parity IV"."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from services.repository import examples
from tests.cluster import identity_config, running_cluster
from tests.integration.test_parity3_cluster import QA_INT32_CONFIG, qa_int32_graph

# qa/python_models/add_sub/model.py, which qa/L0_shared_memory/test.sh copies as
# python_int32_int32_int32 (its config's TYPE_FP32 turned TYPE_INT32, max_batch_size 8 added)
QA_ADD_SUB = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.dtypes = [
            pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, name)["data_type"])
            for name in ("OUTPUT0", "OUTPUT1")
        ]

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [
                pb_utils.Tensor("OUTPUT0", (in_0 + in_1).astype(self.dtypes[0])),
                pb_utils.Tensor("OUTPUT1", (in_0 - in_1).astype(self.dtypes[1])),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""
QA_ADD_SUB_CONFIG = (
    'backend: "python"\n'
    + "".join(
        f'{kind} [ {{ name: "{name}" data_type: TYPE_INT32 dims: [ 16 ] }} ]\n'
        for kind, name in (("input", "INPUT0"), ("input", "INPUT1"), ("output", "OUTPUT0"), ("output", "OUTPUT1"))
    )
    + "instance_group [{ kind: KIND_CPU }]\nmax_batch_size: 8\n"
)


# -- item 4's models: qa/python_models/request_rescheduling_addsub, iterative_sequence and
# wrong_return_type as Triton's qa has them, and one that counts its runs per sequence
ADDSUB_RESCHEDULING = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.dtypes = [pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, n)["data_type"])
                       for n in ("OUTPUT0", "OUTPUT1")]
        self.idx = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            response = pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (in_0 + in_1).astype(self.dtypes[0])),
                pb_utils.Tensor("OUTPUT1", (in_0 - in_1).astype(self.dtypes[1]))])
            if self.idx == 0:  # Explicitly reschedule the first request
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                self.idx += 1
            else:
                responses.append(response)
        return responses
"""
ITERATIVE_SEQUENCE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.remaining_response = 0
        self.reset_flag = True

    def execute(self, requests):
        for request in requests:
            in_input = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if self.reset_flag:
                self.remaining_response = in_input[0]
                self.reset_flag = False
            response_sender = request.get_response_sender()
            self.remaining_response -= 1
            response = pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUT", np.array([self.remaining_response], np.int32))])
            if self.remaining_response <= 0:
                response_sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                self.reset_flag = True
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                response_sender.send(response)
        return None
"""
WRONG_RETURN_TYPE = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.dtype = pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            out = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", out.astype(self.dtype))])
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            responses.append(response)  # Should append `None` for rescheduled requests.
        return responses
"""
# runs each request IN times (keyed by its correlation id, which stays), answering the runs and
# the flags it saw; requests of many clients at once interleave in its batches
COUNT_RUNS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = {}
        self.flags = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = request.correlation_id()
            self.runs[key] = self.runs.get(key, 0) + 1
            self.flags.setdefault(key, []).append(request.flags())
            wanted = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if self.runs[key] < wanted:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                continue
            runs, flags = self.runs.pop(key), self.flags.pop(key)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("RUNS", np.array([runs], np.int32)),
                pb_utils.Tensor("FLAGS", np.array(flags, np.int32))]))
        return responses
"""


def _io(kind: str, name: str, datatype: str, dims: str) -> str:
    return f'{kind} [ {{ name: "{name}" data_type: {datatype} dims: [ {dims} ] }} ]\n'


def _python_model(root: Path, name: str, source: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(source)
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n' + config)


def write_rescheduling_models(root: Path) -> None:
    iterative = "sequence_batching { iterative_sequence: true }\ninstance_group [{ kind: KIND_CPU }]\n"
    addsub = "".join(
        _io(kind, name, "TYPE_FP32", "16")
        for kind, name in (("input", "INPUT0"), ("input", "INPUT1"), ("output", "OUTPUT0"), ("output", "OUTPUT1"))
    )
    _python_model(root, "request_rescheduling_addsub", ADDSUB_RESCHEDULING, addsub + iterative)
    decoupled = "max_batch_size: 0\nmodel_transaction_policy { decoupled: True }\n"
    _python_model(
        root,
        "iterative_sequence",
        ITERATIVE_SEQUENCE,
        decoupled + _io("input", "IN", "TYPE_INT32", "1") + _io("output", "OUT", "TYPE_INT32", "1") + iterative,
    )
    wrong = _io("input", "INPUT0", "TYPE_FP32", "4") + _io("output", "OUTPUT0", "TYPE_FP32", "4")
    _python_model(root, "wrong_return_type", WRONG_RETURN_TYPE, wrong + iterative)
    _python_model(
        root,
        "rescheduled_without_iterative",
        WRONG_RETURN_TYPE.replace("responses.append(response)", "responses.append(None)"),
        wrong + "instance_group [{ kind: KIND_CPU }]\n",
    )
    counts = _io("input", "IN", "TYPE_INT32", "1") + _io("output", "RUNS", "TYPE_INT32", "1")
    counts += _io("output", "FLAGS", "TYPE_INT32", "-1")
    _python_model(
        root,
        "count_runs",
        COUNT_RUNS,
        counts + iterative.replace("true }", "true oldest { max_candidate_sequences: 4 } }"),
    )


# item 6: answers the request's parameters as JSON
ECHO_PARAMETERS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("PARAMETERS", np.array([r.parameters().encode()], dtype=np.object_))]) for r in requests]
"""
HTTP_FORWARD = "MY_HEADER.*|^timeout$"  # case-insensitive: my_header_1 matches; `timeout` is reserved
GRPC_FORWARD = "(?-i)MY_HEADER.*|^my_header_2$|^triton_injected_via_header$"  # case-sensitive


# item 5: a python model with an optional input that says whether it came
OPTIONAL_ADD = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            total = x + (y.as_numpy() if y is not None else 0)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", total.astype(np.int32)),
                pb_utils.Tensor("GOT", np.array([int(y is not None)], dtype=np.int32))]))
        return responses
"""


def _optional_ensemble(name: str, member: str, outputs: dict[str, str]) -> str:
    """An ensemble whose INPUT1 is optional, both inputs mapped to one member's."""
    ios = _io("input", "INPUT0", "TYPE_INT32", "16")
    ios += 'input [ { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] optional: true } ]\n'
    ios += "".join(_io("output", tensor, "TYPE_INT32", dims) for tensor, dims in outputs.items())
    output_map = "".join(f'output_map {{ key: "{t}" value: "{t}" }} ' for t in outputs)
    return (
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n{ios}'
        f'ensemble_scheduling {{ step [ {{ model_name: "{member}" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" } '
        f"{output_map}}} ] }}\n"
    )


def write_optional_input_models(root: Path) -> None:
    ios = _io("input", "INPUT0", "TYPE_INT32", "16")
    ios += 'input [ { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] optional: true } ]\n'
    ios += _io("output", "OUTPUT0", "TYPE_INT32", "16") + _io("output", "GOT", "TYPE_INT32", "1")
    _python_model(root, "optional_add", OPTIONAL_ADD, ios + "max_batch_size: 0\ninstance_group [{ kind: KIND_CPU }]\n")
    for name, member, outputs in (
        ("ensemble_optional", "optional_add", {"OUTPUT0": "16", "GOT": "1"}),
        # the member's INPUT1 is required: a request without it reaches the member, which refuses it
        ("ensemble_optional_to_required", "python_nobatch_int32", {"OUTPUT0": "16", "OUTPUT1": "16"}),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(_optional_ensemble(name, member, outputs))
    model = root / "python_nobatch_int32"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(QA_ADD_SUB)
    (model / "config.pbtxt").write_text(QA_ADD_SUB_CONFIG.replace("max_batch_size: 8", "max_batch_size: 0"))


def build_repository(root: Path) -> Path:
    write_rescheduling_models(root)
    write_optional_input_models(root)
    # item 5: --model-config-name alt reads configs/alt.pbtxt where a model has one
    model = examples.write_model(
        root,
        "config_named",
        examples.identity_graph(TensorProto.FLOAT, 2, "config_named"),
        identity_config("config_named", "FP32", 8),
    )
    (model / "configs").mkdir()
    (model / "configs" / "alt.pbtxt").write_text(identity_config("config_named", "FP32", 4))
    echo = _io("input", "INPUT0", "TYPE_FP32", "1") + _io("output", "PARAMETERS", "TYPE_STRING", "1")
    _python_model(root, "echo_parameters", ECHO_PARAMETERS, echo + "instance_group [{ kind: KIND_CPU }]\n")
    model = root / "python_int32_int32_int32"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(QA_ADD_SUB)
    (model / "config.pbtxt").write_text(QA_ADD_SUB_CONFIG)
    # test.sh copies only version 1 of the generated onnx model (`cp -r .../${model}/1`)
    onnx = examples.write_model(root, "onnx_int32_int32_int32", qa_int32_graph(False), QA_INT32_CONFIG, 1)
    (onnx / "output0_labels.txt").write_text("".join(f"label{i}\n" for i in range(16)))
    return root


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = build_repository(tmp_path_factory.mktemp("parity4"))
    repository = {
        "model_control_mode": "explicit",
        "load_model": ["*"],
        "model_config_name": "alt",
    }  # item 4 reloads models, as qa does
    forward = {"http_header_forward_pattern": HTTP_FORWARD, "grpc_header_forward_pattern": GRPC_FORWARD}
    with running_cluster(root, repository=repository, allow_client_shm=True, **forward) as running:
        yield running


def _client(served, protocol: str):
    if protocol == "http":
        return httpclient.InferenceServerClient(served.url, network_timeout=60)
    return grpcclient.InferenceServerClient(served.grpc_url)


# -- item 2: shared-memory regions registered at large offsets ------------------------------------------
PLATFORMS = ("python", "onnx")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_qa_large_shm_register_offset_on_each_platform_as_test_sh_prepares_them(served, protocol):
    """qa/L0_shared_memory test_large_shm_register_offset as written: for each platform, four
    regions registered 1023 pages into 1024-page keys (made anew each time under the same keys),
    `iu.shm_basic_infer`'s outputs (OUTPUT0 binary, OUTPUT1 JSON, both into shared memory), then
    everything unregistered; OUTPUT0 must be INPUT0 + INPUT1 on every platform."""
    module = httpclient if protocol == "http" else grpcclient
    client = _client(served, protocol)
    page = os.sysconf("SC_PAGE_SIZE")
    offset = page * 1023
    names = ["input0_data", "input1_data", "output0_data", "output1_data"]
    tag = uuid.uuid4().hex[:8]
    handles: list = []
    input0, input1 = np.arange(16, dtype=np.int32), np.ones(16, dtype=np.int32)
    try:
        for platform in PLATFORMS * 2:
            for handle in handles:  # _configure_server's _cleanup_shm_handles: the same keys again
                shm.destroy_shared_memory_region(handle)
            handles = [shm.create_shared_memory_region(n, f"/{n}_{tag}", page * 1024) for n in names]
            for name in names:
                client.register_system_shared_memory(name, f"/{name}_{tag}", 64, offset=offset)
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
            result = client.infer(f"{platform}_int32_int32_int32", inputs, model_version="", outputs=outputs)
            output = result.get_output("OUTPUT0")
            shape = output["shape"] if protocol == "http" else list(output.shape)
            got = shm.get_contents_as_numpy(handles[2], np.int32, shape, offset=offset)
            np.testing.assert_array_equal(got[0], input0 + input1, err_msg=platform)
            np.testing.assert_array_equal(
                shm.get_contents_as_numpy(handles[3], np.int32, shape, offset=offset)[0], input0 - input1
            )
            client.unregister_system_shared_memory()
    finally:
        client.unregister_system_shared_memory()
        for handle in handles:
            shm.destroy_shared_memory_region(handle)
        client.close()


def _offsets() -> list[int]:
    page = os.sysconf("SC_PAGE_SIZE")
    offsets = [page - 8, page - 60, page * 1023 + 24]  # tensors straddling a page boundary
    # above 2 GiB and 4 GiB: the keys are sparse (ftruncate), so only the pages written cost memory;
    # where /dev/shm cannot even hold that size, those cases are left out
    if os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize > 2**32 + 2**20:
        offsets += [2**31 - 32, 2**31 + 8, 2**32 + page - 8]
    return offsets


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("offset", _offsets())
def test_tensors_at_the_end_of_a_region_far_into_its_key_are_read_and_written_in_place(served, protocol, offset):
    """Item 2's sweep: a 256-byte region registered `offset` bytes into a key that ends where it
    ends; the inputs at its start and the two outputs in its last 128 bytes, on a python and an
    onnx model: each answer lands exactly where asked and nothing else in the region moves."""
    module = httpclient if protocol == "http" else grpcclient
    client = _client(served, protocol)
    key = f"/sweep_{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region(key.lstrip("/"), key, offset + 256)
    input0 = np.arange(16, dtype=np.int32) * 7 + offset % 1000
    input1 = np.arange(16, dtype=np.int32) + 3
    try:
        client.register_system_shared_memory("sweep", key, 256, offset=offset)
        shm.set_shared_memory_region(handle, [input0, input1], offset=offset)
        for platform in PLATFORMS:
            inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_shared_memory("sweep", 64, offset=0)
            inputs[1].set_shared_memory("sweep", 64, offset=64)
            outputs = [module.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
            outputs[0].set_shared_memory("sweep", 64, offset=128)
            outputs[1].set_shared_memory("sweep", 64, offset=192)
            client.infer(f"{platform}_int32_int32_int32", inputs, outputs=outputs)
            region = shm.get_contents_as_numpy(handle, np.int32, [64], offset=offset)
            np.testing.assert_array_equal(region, np.concatenate([input0, input1, input0 + input1, input0 - input1]))
            shm.set_shared_memory_region(handle, [np.zeros(32, np.int32)], offset=offset + 128)
    finally:
        client.unregister_system_shared_memory("sweep")
        shm.destroy_shared_memory_region(handle)
        client.close()


# -- item 4: request rescheduling and iterative sequences -----------------------------------------------
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_rescheduled_request_runs_again_and_gets_its_one_answer(served, protocol):
    """qa/L0_backend_python/request_rescheduling grpc_endpoint_test `test_grpc_non_decoupled` (here
    over both protocols): the model reschedules its first request, answering None for it, and
    answers it when it runs again."""
    module = httpclient if protocol == "http" else grpcclient
    client = _client(served, protocol)
    client.unload_model("request_rescheduling_addsub")  # reload: the model's first request again
    client.load_model("request_rescheduling_addsub")
    a, b = np.random.randn(16).astype(np.float32), np.random.randn(16).astype(np.float32)
    inputs = [module.InferInput(n, [16], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("request_rescheduling_addsub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    client.close()


def test_an_iterative_decoupled_model_streams_from_each_run(served):
    """grpc_endpoint_test `test_grpc_decoupled`: IN = 3 answers 2, 1, 0, one response a run, the
    request rescheduled twice (Triton's python_backend README, "Request Rescheduling")."""
    import queue

    received: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(served.grpc_url)
    client.unload_model("iterative_sequence")
    client.load_model("iterative_sequence")
    client.start_stream(callback=lambda result, error: received.put(error or result))
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([3], dtype=np.int32))
    client.async_stream_infer(model_name="iterative_sequence", inputs=[tensor])
    got = []
    for _ in range(3):
        item = received.get(timeout=30)
        assert not isinstance(item, Exception), item
        got.append(int(item.as_numpy("OUT")[0]))
    client.stop_stream()
    client.close()
    assert got == [2, 1, 0]


def test_many_requests_rescheduled_at_once_each_keep_their_sequence(served):
    """Concurrent requests without correlation ids each get a sequence of their own; each runs
    IN times under one correlation id, START on its first run and no flag after (core's
    IterativeSequencer sets 0), and gets one answer; the slots they held are free afterwards."""
    from concurrent.futures import ThreadPoolExecutor

    def one(runs: int) -> tuple[int, list[int]]:
        client = httpclient.InferenceServerClient(served.url, network_timeout=60)
        tensor = httpclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([runs], dtype=np.int32))
        result = client.infer("count_runs", [tensor])
        client.close()
        return int(result.as_numpy("RUNS")[0]), result.as_numpy("FLAGS").tolist()

    wanted = [1, 2, 3, 5, 4, 1, 6, 2]  # more requests than the 4 slots: some wait in the backlog
    with ThreadPoolExecutor(len(wanted)) as pool:
        results = list(pool.map(one, wanted * 2))
    for runs, (ran, flags) in zip(wanted * 2, results):
        assert ran == runs and flags == [1] + [0] * (runs - 1), (runs, ran, flags)


def test_a_rescheduled_request_answered_with_a_response_fails_in_tritons_words(served):
    """wrong_return_type (bls_request_rescheduling `test_wrong_return_type`): a response for a
    rescheduled request is pb_stub's error; rescheduling on a model whose sequence batcher is not
    iterative is core's."""
    client = _client(served, "http")
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.ones(4, np.float32))
    with pytest.raises(InferenceServerException) as wrong:
        client.infer("wrong_return_type", [tensor])
    assert "Expected a None object in the execute function return list for reschduled request" in wrong.value.message()
    with pytest.raises(InferenceServerException) as refused:
        client.infer("rescheduled_without_iterative", [tensor])
    assert refused.value.message().endswith(
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured "
        "to handle such a flag."
    )
    client.close()


# -- item 6: header forwarding and the gRPC stream's error mode ------------------------------------------
HEADERS = {"MY_HEADER_1": "my_value_1", "my_header_2": "my_value_2", "other": "x"}


def _echo(module, client, headers: dict[str, str]) -> dict:
    import json

    tensor = module.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, np.float32))
    result = client.infer("echo_parameters", [tensor], headers=dict(headers))  # (the HTTP client adds to it)
    return json.loads(result.as_numpy("PARAMETERS")[0])


def test_http_headers_matching_the_pattern_become_parameters(served):
    """qa/L0_parameters test_headers: `--http-header-forward-pattern MY_HEADER.*` forwards
    my_header_1 and my_header_2 whatever their case (HTTP header names are case-insensitive),
    nothing else; a reserved name is Triton's 400."""
    client = _client(served, "http")
    assert _echo(httpclient, client, HEADERS) == {"my_header_1": "my_value_1", "my_header_2": "my_value_2"}
    with pytest.raises(InferenceServerException) as reserved:
        _echo(httpclient, client, {"timeout": "5"})
    assert reserved.value.status() == "400"
    assert reserved.value.message() == "Header 'timeout' is reserved for Triton usage and cannot be forwarded."
    client.close()


def test_grpc_metadata_matching_the_pattern_become_parameters(served):
    """qa/L0_parameters test_grpc_header_forward_pattern_case_sensitive: `(?-i)` makes the pattern
    case-sensitive, and gRPC metadata keys are lowercase: MY_HEADER.* forwards nothing, my_header_2
    is named exactly; on a stream too. A reserved `triton_` key is Triton's INVALID_ARGUMENT."""
    import queue

    client = _client(served, "grpc")
    lowercase = {key.lower(): value for key, value in HEADERS.items()}  # gRPC refuses uppercase keys
    assert _echo(grpcclient, client, lowercase) == {"my_header_2": "my_value_2"}
    with pytest.raises(InferenceServerException) as reserved:
        _echo(grpcclient, client, {"triton_injected_via_header": "1"})
    assert "StatusCode.INVALID_ARGUMENT" in str(reserved.value.status())
    assert "Header 'triton_injected_via_header' is reserved for Triton usage" in reserved.value.message()
    received: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: received.put(error or result), headers=lowercase)
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, np.float32))
    client.async_stream_infer("echo_parameters", [tensor])
    import json

    assert json.loads(received.get(timeout=30).as_numpy("PARAMETERS")[0]) == {"my_header_2": "my_value_2"}
    client.stop_stream()
    client.close()


@pytest.mark.parametrize("error_mode", [False, True])
def test_a_stream_in_triton_grpc_error_mode_ends_at_the_first_error(served, error_mode):
    """qa/L0_backend_python/lifecycle test_triton_grpc_error_error_on: with `triton_grpc_error:
    true` in the stream's metadata a failed request closes the stream with its status
    (INTERNAL here); without it, each failure is a message on the stream, which goes on."""
    import queue

    received: queue.Queue = queue.Queue()
    client = _client(served, "grpc")
    headers = {"triton_grpc_error": "true"} if error_mode else None
    client.start_stream(callback=lambda result, error: received.put(error or result), headers=headers)
    tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.ones(4, np.float32))
    for _ in range(2):
        client.async_stream_infer("wrong_return_type", [tensor])
    first = received.get(timeout=30)
    assert isinstance(first, InferenceServerException)
    assert "Expected a None object in the execute function return list" in first.message()
    if error_mode:
        assert str(first.status()) == "StatusCode.INTERNAL"
        with pytest.raises(queue.Empty):  # the stream is closed: nothing more comes
            received.get(timeout=2)
    else:
        second = received.get(timeout=30)
        assert isinstance(second, InferenceServerException) and "Expected a None object" in second.message()
    client.stop_stream()
    client.close()


# -- item 5: --model-config-name ------------------------------------------------------------------------
def test_model_config_name_picks_the_named_config_where_a_model_has_one(served):
    """core's GetModelConfigFullPath: `<model>/configs/<name>.pbtxt` if it exists, else
    `config.pbtxt` (qa/L0_model_config's custom config tests)."""
    client = _client(served, "http")
    assert client.get_model_config("config_named")["max_batch_size"] == 4  # configs/alt.pbtxt
    assert client.get_model_config("python_int32_int32_int32")["max_batch_size"] == 8  # its config.pbtxt
    client.close()


# -- item 5: optional inputs of ensembles -------------------------------------------------------
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_optional_ensemble_input_left_out_reaches_its_step_left_out(served, protocol):
    """core's EnsembleContext: an optional ensemble input the request omits is an empty
    placeholder; the steps that consume it run without that input (their model's input being
    optional too), instead of waiting for it forever."""
    module = httpclient if protocol == "http" else grpcclient
    client = _client(served, protocol)
    x = np.arange(16, dtype=np.int32)
    only = module.InferInput("INPUT0", [16], "INT32")
    only.set_data_from_numpy(x)
    result = client.infer("ensemble_optional", [only])
    assert (result.as_numpy("OUTPUT0") == x).all() and result.as_numpy("GOT")[0] == 0
    both = [only, module.InferInput("INPUT1", [16], "INT32")]
    both[1].set_data_from_numpy(np.full(16, 10, np.int32))
    result = client.infer("ensemble_optional", both)
    assert (result.as_numpy("OUTPUT0") == x + 10).all() and result.as_numpy("GOT")[0] == 1
    # mapped to a required input: the member refuses the step's request, in its own words
    with pytest.raises(InferenceServerException) as err:
        client.infer("ensemble_optional_to_required", [only])
    assert "in ensemble 'ensemble_optional_to_required'" in err.value.message()
    assert "missing required input(s) ['INPUT1']" in err.value.message()
    client.close()
