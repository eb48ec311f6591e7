"""Triton's python client example `simple_http_model_control.py`, step by step, against Shoal.

The example runs against Triton's qa repository of seven models in explicit mode, `simple`
among them with max_batch_size 8. Each step below is one of the example's, with the check the
example makes; the example ends with "PASS: model control" when every step held.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from services.repository import examples
from tests.cluster import identity_config, running_cluster


def model_control_example(client: httpclient.InferenceServerClient) -> str:
    """The example's steps; returns what it prints last, or raises AssertionError at the step it exits."""
    model = "simple"
    assert len(client.get_model_repository_index()) == 7, "the repository holds seven models"
    client.load_model(model)
    assert client.is_model_ready(model), "simple is ready after load"

    # a config override that is not JSON at all: the load fails and says so
    with pytest.raises(InferenceServerException) as bad:
        client.load_model(model, config='"parameters": {"config": {{"max_batch_size": "16"}}}')
    assert "failed to load" in bad.value.message(), bad.value.message()

    # the quoted number is valid protobuf JSON for an int32 field
    client.load_model(model, config='{"max_batch_size":"16"}')
    assert client.get_model_config(model)["max_batch_size"] == 16

    client.unload_model(model)
    assert not client.is_model_ready(model), "simple is not ready after unload"

    with pytest.raises(InferenceServerException) as unknown:
        client.load_model("wrong_model_name")
    assert "failed to load" in unknown.value.message(), unknown.value.message()
    return "PASS: model control"


@pytest.fixture(scope="module")
def seven_models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("model_control")
    examples.write_examples(root)  # simple, identity_fp32, mlp
    for name in ("identity_a", "identity_b", "identity_c", "identity_d"):
        examples.write_model(
            root, name, examples.identity_graph(TensorProto.FLOAT, 2, name), identity_config(name, "FP32")
        )
    return root


def test_simple_http_model_control_example_passes(seven_models):
    with running_cluster(seven_models, repository={"model_control_mode": "explicit"}) as running:
        client = httpclient.InferenceServerClient(running.url, network_timeout=120)
        try:
            assert model_control_example(client) == "PASS: model control"
        finally:
            client.close()
