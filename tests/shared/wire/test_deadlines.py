import time

from hypothesis import given
from hypothesis import strategies as st

from shared.wire.deadlines import seconds_left


@given(st.floats(min_value=-100.0, max_value=100.0), st.floats(min_value=0.0, max_value=5.0))
def test_seconds_left_is_the_time_to_the_deadline_never_under_the_floor(offset_s: float, floor: float) -> None:
    before = time.time_ns()
    left = seconds_left(before + int(offset_s * 1e9), floor)
    after_s = (time.time_ns() - before) / 1e9
    assert left >= floor
    if offset_s > floor + after_s:  # the true figure is above the floor whenever the clock allows it
        assert offset_s - after_s - 1e-6 <= left <= offset_s + 1e-6


def test_a_passed_deadline_is_negative_without_a_floor() -> None:
    assert seconds_left(time.time_ns() - 2_000_000_000) < -1.9
