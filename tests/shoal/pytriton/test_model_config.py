"""The config.pbtxt a binding generates: PyTriton's fields, defaults and names."""

from __future__ import annotations

import numpy as np
import pytest

from shared.config import model_config
from shoal.pytriton.binding import Binding
from shoal.pytriton.decorators import TritonContext
from shoal.pytriton.exceptions import PyTritonBadParameterError, PyTritonValidationError
from shoal.pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor, TimeoutAction


def bind(config: ModelConfig | None = None, functions=None, **io) -> Binding:
    inputs = io.get("inputs", [Tensor(dtype=np.float32, shape=(-1,)), Tensor(dtype=bytes, shape=(1,))])
    outputs = io.get("outputs", [Tensor(dtype=np.int64, shape=(2, -1))])
    return Binding(
        "m",
        1,
        functions or (lambda requests: []),
        inputs,
        outputs,
        config or ModelConfig(),
        TritonContext(),
        False,
        print,
    )


def test_defaults_and_default_names():
    config = bind().config()
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 4
    assert config["dynamic_batching"] == {}
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT_1", "TYPE_FP32", [-1]),
        ("INPUT_2", "TYPE_STRING", [1]),
    ]
    assert [(o["name"], o["data_type"]) for o in config["output"]] == [("OUTPUT_1", "TYPE_INT64")]
    assert config["instance_group"] == [{"count": 1, "kind": "KIND_CPU"}]
    assert "model_transaction_policy" not in config


def test_text_parses_as_a_triton_config():
    text = bind(ModelConfig(batching=False, decoupled=True), functions=[print, print]).config_text()
    parsed = model_config.to_json(model_config.parse_text(text))
    assert parsed["max_batch_size"] == 0 and "max_batch_size: 0" in text  # spelled out, as PyTriton does
    assert "dynamic_batching" not in parsed
    assert parsed["model_transaction_policy"]["decoupled"] is True
    assert parsed["instance_group"][0]["count"] == 2


def test_batcher_fields():
    batcher = DynamicBatcher(
        max_queue_delay_microseconds=100,
        preferred_batch_size=[2, 4],
        priority_levels=2,
        default_priority_level=1,
        default_queue_policy=QueuePolicy(timeout_action=TimeoutAction.DELAY, max_queue_size=5),
    )
    config = bind(ModelConfig(batcher=batcher, response_cache=True)).config()
    db = config["dynamic_batching"]
    assert db["maxQueueDelayMicroseconds"] == 100 and db["preferredBatchSize"] == [2, 4]
    assert db["defaultQueuePolicy"]["timeoutAction"] == "DELAY"
    assert config["response_cache"] == {"enable": True}


def test_bad_bindings_are_refused():
    with pytest.raises(PyTritonBadParameterError):
        bind(ModelConfig(max_batch_size=0)).config()
    with pytest.raises(PyTritonValidationError, match="Output tensors cannot be optional"):
        bind(outputs=[Tensor(dtype=np.float32, shape=(1,), optional=True)])


def test_same_binding_same_fingerprint_other_binding_other():
    same = bind().config()["parameters"]["shoal-in-process"]
    assert bind().config()["parameters"]["shoal-in-process"] == same
    assert bind(ModelConfig(max_batch_size=8)).config()["parameters"]["shoal-in-process"] != same
