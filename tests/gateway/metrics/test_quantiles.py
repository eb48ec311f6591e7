"""`summary_quantiles` read as Triton's core reads it (std::stod per half, bad pairs skipped)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.gateway.metrics.quantiles import parse_quantiles, stod


def test_tritons_qa_value_reads_the_leading_number():
    assert parse_quantiles("0.1:0.0.1,0.7:0.01,0.75:0.01") == ((0.1, 0.0), (0.7, 0.01), (0.75, 0.01))


def test_pairs_triton_skips():
    assert parse_quantiles("0.5,x:0.1,0.9:y,0.99:0.001,") == ((0.99, 0.001),)
    assert parse_quantiles("") == ()


def test_stod_takes_the_longest_leading_number():
    assert stod(" 1e3x") == 1000.0 and stod("-.5") == -0.5 and stod("2e") == 2.0 and stod("7.") == 7.0
    assert stod("") is None and stod(".") is None and stod("e1") is None


@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), max_size=6))
def test_well_formed_pairs_round_trip(pairs):
    text = ",".join(f"{q!r}:{e!r}" for q, e in pairs)
    assert parse_quantiles(text) == tuple(pairs)
