from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from services.worker.batch import gather, scatter
from shared.model_config import ModelSpec, TensorSpec


def spec(reshape=None) -> ModelSpec:
    return ModelSpec(
        "m",
        "",
        "onnxruntime",
        8,
        (TensorSpec("X", "FP32", (3,), reshape),),
        (TensorSpec("Y", "FP32", (3,), reshape),),
        None,
        1,
        "KIND_CPU",
        False,
        "",
    )


@given(st.lists(st.integers(1, 4), min_size=1, max_size=6))
def test_scatter_of_gather_is_identity(sizes):
    requests = [{"X": np.full((n, 3), i, np.float32)} for i, n in enumerate(sizes)]
    batched = gather(spec(), requests)
    assert batched["X"].shape == (sum(sizes), 3)
    pieces = scatter(spec(), {"Y": batched["X"]}, sizes)
    for request, piece in zip(requests, pieces):
        np.testing.assert_array_equal(piece["Y"], request["X"])


def test_reshape_applies_to_backend_and_back():
    s = spec(reshape=(1, 3))
    batched = gather(s, [{"X": np.ones((2, 3), np.float32)}])
    assert batched["X"].shape == (2, 1, 3)
    pieces = scatter(s, {"Y": batched["X"]}, [2])
    assert pieces[0]["Y"].shape == (2, 3)
