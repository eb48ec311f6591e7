"""Every service of a cluster reaches NATS as its own kind (issue 44): nats-server's /connz says
which identity each named connection proved, and a service connection without credentials (which
the test clusters would admit as the tests' own anonymous `admin`) fails this test."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import tritonclient.http as httpclient

from services.repository import examples
from tests.cluster import running_cluster
from tests.serving import wait_until

pytestmark = pytest.mark.timeout(300)

MODEL_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests
        ]
"""
CONFIG = """
name: "echo"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


def kind_of(name: str) -> str:
    """The kind a service's connection name says it is (`shoal-<kind>-<id>`; a python model's
    process is `shoal-worker-<worker>-py-<model>...`, the worker's heartbeat `...-heartbeat`)."""
    kind = name.removeprefix("shoal-").split("-", 1)[0]
    return "instance" if kind == "worker" and "-py-" in name else kind


def test_every_service_connects_with_its_kinds_identity(tmp_path):
    examples.write_examples(tmp_path)
    (tmp_path / "echo" / "1").mkdir(parents=True)
    (tmp_path / "echo" / "1" / "model.py").write_text(textwrap.dedent(MODEL_PY))
    (tmp_path / "echo" / "config.pbtxt").write_text(CONFIG)
    with running_cluster(tmp_path, shape="standalone") as running:
        client = httpclient.InferenceServerClient(running.url)
        x = np.ones((1, 2), dtype=np.float32)
        tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(x)
        assert (client.infer("echo", [tensor]).as_numpy("OUTPUT0") == x).all()  # the instances serve
        identities = running.cluster.runtime.identities
        assert identities is not None
        wanted = {"gateway", "scheduler", "worker", "instance", "repository"}

        def connections() -> list[dict]:
            found = running.nats.monitor("connz?auth=1&limit=4096")["connections"]
            return [c for c in found if c.get("name", "").startswith("shoal-")]

        wait_until(
            lambda: wanted <= {kind_of(c["name"]) for c in connections()},
            60,
            "a connection of every kind",
            detail=lambda: [c.get("name") for c in connections()],
        )
        for conn in connections():
            kind = kind_of(conn["name"])
            assert conn.get("authorized_user") == identities.keys[kind], (conn["name"], conn.get("authorized_user"))
        heartbeats = [c for c in connections() if c["name"].endswith("-heartbeat")]
        assert heartbeats and all(c["authorized_user"] == identities.keys["worker"] for c in heartbeats)
