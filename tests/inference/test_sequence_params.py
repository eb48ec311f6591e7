"""The sequence request parameters, as the gateway reads them."""

from __future__ import annotations

import pytest

from inference.sequence_params import SequenceParams, sequence_params
from shared.errors import ShoalError


def test_uint64_and_string_ids():
    assert sequence_params({}) == SequenceParams()
    assert sequence_params({"sequence_id": 2**64 - 1, "sequence_start": True}) == SequenceParams(2**64 - 1, True, False)
    assert sequence_params({"sequence_id": "abc", "sequence_end": True}) == SequenceParams("abc", False, True)


@pytest.mark.parametrize(
    "params",
    [{"sequence_id": -1}, {"sequence_id": 1.5}, {"sequence_id": True}, {"sequence_id": 2**64}, {"sequence_start": 1}],
)
def test_bad_values_are_refused(params):
    with pytest.raises(ShoalError):
        sequence_params(params)
