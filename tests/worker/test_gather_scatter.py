from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from services.worker.backends.gather_scatter import gather, scatter
from shared.config.model_config import ModelSpec, TensorSpec


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


RAGGED = ModelSpec(
    "r",
    "",
    "onnxruntime",
    8,
    (TensorSpec("X", "FP32", (-1,), allow_ragged_batch=True),),
    (TensorSpec("Y", "FP32", (-1,)),),
    None,
    1,
    "KIND_CPU",
    False,
    "",
    config={"batch_output": [{"target_name": ["Y"], "kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", "source_input": ["X"]}]},
)


@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 5)), min_size=1, max_size=5))
def test_a_ragged_batch_goes_flat_and_comes_back_in_each_requests_shape(shapes):
    """Issue 28 item 10: Triton's ragged input and BATCH_SCATTER_WITH_INPUT_SHAPE output."""
    requests = [{"X": np.full(shape, i, np.float32)} for i, shape in enumerate(shapes)]
    batched = gather(RAGGED, requests)
    assert batched["X"].shape == (sum(rows * width for rows, width in shapes),)
    pieces = scatter(RAGGED, {"Y": batched["X"]}, [rows for rows, _ in shapes], requests)
    for request, piece in zip(requests, pieces):
        np.testing.assert_array_equal(piece["Y"], request["X"])
