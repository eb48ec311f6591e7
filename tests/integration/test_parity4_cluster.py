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

from services.repository import examples
from tests.cluster import running_cluster
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


def build_repository(root: Path) -> Path:
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
    with running_cluster(build_repository(tmp_path_factory.mktemp("parity4")), allow_client_shm=True) as running:
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
