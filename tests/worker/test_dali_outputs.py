"""`split_along_outer_axis` as Triton's DALI backend applies it (dali_outputs.py): each request's
split output is its own samples' outer dimensions as a batch; the other outputs one sample per
row; requests batched together may answer different shapes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.worker.backends.dali_outputs import outputs_to_split, per_request
from shared.errors import ShoalError


def test_the_parameter_is_a_colon_separated_list():
    assert outputs_to_split("OUTPUT1:OUTPUT2") == {"OUTPUT1", "OUTPUT2"}
    assert outputs_to_split("") == set() and outputs_to_split("A:") == {"A"}


@given(
    outer=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    cut=st.integers(0, 6),
    inner=st.tuples(st.integers(1, 3), st.integers(1, 3)),  # samples (n_i, 2 dims): at least 2-D
)
def test_a_split_output_answers_the_sum_of_its_rows_outer_dimensions(outer, cut, inner):
    """Triton's docs: samples (n_i, d_1, ..., d_D) become sum(n_i) samples (d_1, ..., d_D)."""
    samples = [np.full((n, *inner), row, np.float32) for row, n in enumerate(outer)]
    plain = [np.full((2,), row, np.int32) for row in range(len(outer))]
    cut = min(cut, len(outer))
    sizes = [size for size in (cut, len(outer) - cut) if size]  # a request has a row at least
    answers = per_request({"FRAMES": samples, "ID": plain}, sizes, {"FRAMES"})
    start = 0
    for answer, size in zip(answers, sizes):
        rows = range(start, start + size)
        assert answer["FRAMES"].shape == (sum(outer[r] for r in rows), *inner)
        expected = [r for r in rows for _ in range(outer[r])]
        np.testing.assert_array_equal(answer["FRAMES"][:, 0, 0], expected)
        np.testing.assert_array_equal(answer["ID"], np.array([[r, r] for r in rows], np.int32).reshape(size, 2))
        start += size


def test_requests_batched_together_may_answer_different_shapes():
    samples = [np.zeros((2, 3)), np.zeros((2, 3)), np.zeros((4, 5))]
    answers = per_request({"OUT": samples}, [2, 1], set())
    assert [a["OUT"].shape for a in answers] == [(2, 2, 3), (1, 4, 5)]


def test_what_cannot_be_one_tensor_fails():
    with pytest.raises(ShoalError, match="different shapes"):
        per_request({"OUT": [np.zeros((2, 3)), np.zeros((2, 4))]}, [2], {"OUT"})
    with pytest.raises(ShoalError, match="different shapes"):
        per_request({"OUT": [np.zeros(3), np.zeros(4)]}, [2], set())
    with pytest.raises(ShoalError, match="To split outer dimension, the batch must be at least 2-dimensional"):
        per_request({"OUT": [np.zeros(3), np.zeros(3)]}, [2], {"OUT"})
