"""Triton's protobuf modules without tritonclient.grpc's `__init__` (shared/config/triton_protos.py):
in a fresh interpreter, since what is imported is the process's own state."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shared.config import triton_protos

PROBE = """
import sys
from shared.config import triton_protos
grpc_stubs = triton_protos.load("service_pb2_grpc")
service = triton_protos.load("service_pb2")
config = triton_protos.load("model_config_pb2")
print("tritonclient.grpc" in sys.modules, "tritonclient.grpc._client" in sys.modules, "packaging" in sys.modules)
print(service.ModelInferRequest().DESCRIPTOR.full_name, config.ModelConfig(name="m").name)
import tritonclient.grpc  # the real package afterwards: its __init__ runs and binds the same modules
print(tritonclient.grpc.service_pb2 is service, tritonclient.grpc.model_config_pb2 is config,
      tritonclient.grpc.service_pb2_grpc is grpc_stubs, hasattr(tritonclient.grpc, "InferenceServerClient"))
"""


def _run(probe: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split()


def test_the_modules_come_without_the_client_which_stays_importable_with_the_same_modules():
    assert _run(PROBE) == ["False", "False", "False", "inference.ModelInferRequest", "m", *["True"] * 4]


def test_a_process_that_imported_tritonclient_grpc_gets_its_modules():
    probe = "import tritonclient.grpc as g\nfrom shared.config import triton_protos\n"
    probe += (
        'print(triton_protos.load("service_pb2") is g.service_pb2, "tritonclient.grpc" in __import__("sys").modules)'
    )
    assert _run(probe) == ["True", "True"]


def test_only_tritonclients_protobuf_modules_are_loaded():
    with pytest.raises(ValueError, match="not one of"):
        triton_protos.load("_client")
