"""PyTriton's decorators on requests as the worker hands them over (through a real Binding)."""

from __future__ import annotations

import numpy as np
import pytest

from services.worker.python.hosting.callables import CallRequest
from shared.errors import ShoalError
from shoal.pytriton.binding import Binding
from shoal.pytriton.decorators import (
    ConstantPadder,
    batch,
    fill_optionals,
    first_value,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
    triton_context,
)
from shoal.pytriton.decorators import TritonContext as Context
from shoal.pytriton.model_config import DynamicBatcher, ModelConfig, Tensor


def run(function, requests, config=None, inputs=None, outputs=None):
    binding = Binding(
        "m",
        1,
        function,
        inputs or [Tensor(name="x", dtype=np.float32, shape=(-1,)), Tensor(name="t", dtype=np.float32, shape=(1,))],
        outputs or [Tensor(name="y", dtype=np.float32, shape=(-1,))],
        config or ModelConfig(max_batch_size=8),
        Context(),
        False,
        print,
    )
    return binding.handler(0)([CallRequest(r) for r in requests])


def test_batch_concatenates_and_splits():
    seen = []

    @batch
    def f(x):
        seen.append(x.shape)
        return [x + 1]

    out = run(f, [{"x": np.zeros((1, 2), np.float32)}, {"x": np.ones((2, 2), np.float32)}])
    assert seen == [(3, 2)]
    assert [o["y"].tolist() for o in out] == [[[1, 1]], [[2, 2], [2, 2]]]


def test_batch_checks_the_output_batch_size():
    @batch
    def f(x):
        return {"y": x[:1]}

    with pytest.raises(ShoalError, match="Expected batch size: 2"):
        run(f, [{"x": np.zeros((1, 2), np.float32)}, {"x": np.ones((1, 2), np.float32)}])


def test_sample_on_a_non_batching_model():
    @sample
    def f(x):
        return [x * 3]

    out = run(f, [{"x": np.ones(2, np.float32)}], config=ModelConfig(batching=False))
    assert out[0]["y"].tolist() == [3, 3]


def test_group_by_keys_and_fill_optionals():
    calls = []

    @fill_optionals(t=np.array([5.0], np.float32))
    @group_by_keys
    @batch
    def f(x, t):
        calls.append(x.shape[0])
        return {"y": x * t}

    out = run(
        f,
        [{"x": np.ones((1, 1), np.float32)}, {"x": np.ones((1, 1), np.float32), "t": np.full((1, 1), 2.0, np.float32)}],
    )
    assert [o["y"].tolist() for o in out] == [[[5.0]], [[2.0]]]
    assert calls == [2]  # with the default filled in, both requests batch together


def test_group_by_values_with_padding():
    @batch
    @group_by_values("t", pad_fn=ConstantPadder(0))
    def f(x, t):
        return {"y": np.tile(x, (1, int(t[0][0])))}

    out = run(
        f,
        [
            {"x": np.ones((1, 1), np.float32), "t": np.array([[1]], np.float32)},
            {"x": np.ones((1, 1), np.float32), "t": np.array([[2]], np.float32)},
        ],
    )
    assert [o["y"].tolist() for o in out] == [[[1, 0]], [[1, 1]]]


def test_first_value_and_pad_batch_and_context():
    @batch
    @pad_batch
    @first_value("t")
    @triton_context
    def f(x, t, triton_context):
        assert t == 3.0
        assert x.shape[0] == 4  # padded to the preferred batch size
        assert triton_context.model_configs[f].max_batch_size == 8
        return {"y": x[:2]}

    config = ModelConfig(max_batch_size=8, batcher=DynamicBatcher(preferred_batch_size=[4]))
    requests = [{"x": np.ones((1, 1), np.float32), "t": np.full((1, 1), 3.0, np.float32)}] * 2
    out = run(f, requests, config=config)
    assert len(out) == 2
