"""Triton's batch inputs (model_config.proto's BatchInput.Kind), with its documented examples."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.worker.batch_inputs import BatchInput, compute, parse
from shared.errors import ShoalError


def rule(kind: str, dtype: str = "TYPE_FP32") -> BatchInput:
    return parse({"batch_input": [{"kind": kind, "target_name": ["T"], "data_type": dtype, "source_input": ["X"]}]})[0]


# the proto's example: a batch-2 request of item shape [3, 1] and a batch-1 request of [2, 2]
EXAMPLE = [{"X": np.zeros((2, 3, 1), np.float32)}, {"X": np.zeros((1, 2, 2), np.float32)}]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("BATCH_ELEMENT_COUNT", [6, 4]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT", [6, 10]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", [0, 6, 10]),
        ("BATCH_ITEM_SHAPE", [[3, 1], [3, 1], [2, 2]]),
        ("BATCH_ITEM_SHAPE_FLATTEN", [3, 1, 3, 1, 2, 2]),
    ],
)
def test_each_kind_as_triton_documents_it(kind: str, expected: list) -> None:
    tensor = compute([rule(kind)], EXAMPLE, batching=True)["T"]
    assert tensor.dtype == np.float32
    assert tensor.tolist() == expected


def test_the_max_element_count_is_a_shape() -> None:
    assert compute([rule("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE")], EXAMPLE, batching=True)["T"].shape == (6,)


def test_every_target_name_gets_the_tensor_in_the_configured_type() -> None:
    (both,) = parse(
        {
            "batch_input": [
                {
                    "kind": "BATCH_ELEMENT_COUNT",
                    "target_name": ["A", "B"],
                    "data_type": "TYPE_INT32",
                    "source_input": ["X"],
                }
            ]
        }
    )
    tensors = compute([both], EXAMPLE, batching=True)
    assert set(tensors) == {"A", "B"} and tensors["A"].dtype == np.int32


@pytest.mark.parametrize(
    ("entry", "text"),
    [
        ({"kind": "BATCH_SOMETHING", "data_type": "TYPE_FP32", "source_input": ["X"]}, "unexpected batch input kind"),
        (
            {"kind": "BATCH_ELEMENT_COUNT", "data_type": "TYPE_NOPE", "source_input": ["X"]},
            "unexpected batch input data type",
        ),
        ({"kind": "BATCH_ELEMENT_COUNT", "data_type": "TYPE_FP32"}, "expects a source input"),
    ],
)
def test_a_bad_batch_input_fails_the_load(entry: dict, text: str) -> None:
    with pytest.raises(ShoalError, match=text):
        parse({"batch_input": [{"target_name": ["T"], **entry}]})


@given(st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=6))
def test_accumulated_counts_bound_each_requests_slice_of_the_flat_batch(widths: list[int]) -> None:
    requests = [{"X": np.arange(w, dtype=np.float32).reshape(1, w)} for w in widths]
    flat = np.concatenate([r["X"].reshape(-1) for r in requests])
    ends = compute([rule("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "TYPE_INT32")], requests, batching=True)["T"]
    for request, start, end in zip(requests, ends[:-1], ends[1:]):
        np.testing.assert_array_equal(flat[start:end], request["X"].reshape(-1))
