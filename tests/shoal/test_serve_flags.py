"""tritonserver flags that `shoal serve` parsed and dropped, or refused (issue 48, item 8): each
started with `shoal serve` and its effect observed through tritonclient and the serve's output."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto

from services.repository import examples
from shared.process.natsserver import free_port
from tests.cluster import identity_config
from tests.shoal.serving import Serve, one_model_repository, serve

ECHO_PARAMETERS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "PARAMETERS", np.array([r.parameters().encode()], dtype=np.object_))]) for r in requests]
"""
ECHO_CONFIG = """name: "echo_parameters"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PARAMETERS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def _repository(root: Path) -> Path:
    """`config_named` (max_batch_size 8; 4 in configs/alt.pbtxt) and `echo_parameters`."""
    graph = examples.identity_graph(TensorProto.FLOAT, 2, "config_named")
    model = examples.write_model(root, "config_named", graph, identity_config("config_named", "FP32", 8))
    (model / "configs").mkdir()
    (model / "configs" / "alt.pbtxt").write_text(identity_config("config_named", "FP32", 4))
    (root / "echo_parameters" / "1").mkdir(parents=True)
    (root / "echo_parameters" / "1" / "model.py").write_text(ECHO_PARAMETERS)
    (root / "echo_parameters" / "config.pbtxt").write_text(ECHO_CONFIG)
    return root


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("serve_flags")
    flags = ("--model-config-name=alt", "--http-header-forward-pattern=MY_HEADER.*")
    with serve(_repository(root / "models"), root / "cache", *flags) as running:
        running.wait_for("Started HTTPService")
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}", network_timeout=60)
        yield client
        client.close()


def test_model_config_name_reads_the_named_config(named):
    """core's GetModelConfigFullPath: configs/<name>.pbtxt where the model has one (it kept config.pbtxt)."""
    assert named.get_model_config("config_named")["max_batch_size"] == 4
    assert named.get_model_config("echo_parameters")["max_batch_size"] == 0  # no configs/: its config.pbtxt


def test_http_header_forward_pattern_makes_parameters_of_headers(named):
    """qa/L0_parameters: matching headers, whatever their case, become parameters (they arrived as {})."""
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, np.float32))
    headers = {"MY_HEADER_1": "my_value_1", "other": "x"}
    result = named.infer("echo_parameters", [tensor], headers=headers)
    assert json.loads(result.as_numpy("PARAMETERS")[0]) == {"my_header_1": "my_value_1"}


@pytest.fixture(scope="module")
def http_off(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("http_off")
    grpc_port = free_port()
    flags = (
        "--allow-http=false",
        f"--grpc-port={grpc_port}",
        "--log-format=ISO8601",  # applied through the gateway's HTTP API, which only the supervisor reaches now
        "--grpc-infer-allocation-pool-size=4",
        "--host-policy=numa,cpu-cores=0-1",
        f"--repoagent-directory={root}",
        "--allow-sagemaker=false",  # tritonserver's defaults, said explicitly by cloud launch scripts
        "--allow-vertex-ai=false",  # (both endpoints: tests/shoal/test_sagemaker.py, test_vertex_ai.py)
    )
    with serve(one_model_repository(root / "models", "q"), root / "cache", *flags) as running:
        running.wait_for("Started GRPCInferenceService")
        yield running, grpc_port


def test_allow_http_false_serves_no_http_and_grpc_as_before(http_off):
    running, grpc_port = http_off
    output = running.output()
    assert "Started HTTPService" not in output and "| q " in output  # the model table: ready without HTTP
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", running.http_port), timeout=5).close()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.array([[1.0, 2.0]], np.float32))
        assert client.infer("q", [tensor]).as_numpy("OUTPUT0").tolist() == [[1.0, 2.0]]
    finally:
        client.close()


def _said(running: Serve, flag: str) -> str:
    lines = [line for line in running.output().splitlines() if f"{flag}" in line and "has no effect in Shoal" in line]
    assert len(lines) == 1, running.output()
    return lines[0]


def test_grpc_infer_allocation_pool_size_is_said_to_change_nothing(http_off):
    assert "there is no pool of them to keep" in _said(http_off[0], "--grpc-infer-allocation-pool-size=4")


def test_host_policy_is_accepted_and_said_not_to_bind(http_off):
    assert "not bound to NUMA nodes or CPU cores" in _said(http_off[0], "--host-policy=numa,cpu-cores=0-1")


def test_repoagent_directory_is_accepted_and_said_unread(http_off):
    assert "repository agents are built in (checksum)" in _said(http_off[0], "--repoagent-directory=")
