from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from services.scheduler.batching.formation import BatchPolicy, next_batch


@dataclass
class R:
    batch_size: int = 1
    shape_sig: str = ""
    arrived: float = 0.0


DYN = BatchPolicy(max_batch_size=8, preferred=(), max_queue_delay_s=0.01, dynamic=True)


def test_default_scheduler_takes_one():
    assert next_batch(deque([R(), R()]), BatchPolicy(8), 0).take == 1


def test_waits_for_the_delay_of_the_oldest():
    decision = next_batch(deque([R(arrived=1.0), R(arrived=1.005)]), DYN, now=1.002)
    assert decision.take == 0 and decision.wake_at == 1.01


def test_expired_delay_sends_what_is_pending():
    assert next_batch(deque([R(arrived=1.0), R(arrived=1.005)]), DYN, now=1.011).take == 2


def test_full_batch_goes_at_once():
    decision = next_batch(deque(R() for _ in range(10)), DYN, now=0.0)
    assert decision.take == 8 and decision.reason == "preferred batch size"


def test_preferred_size_prefix():
    policy = BatchPolicy(8, (2, 4), 1.0, True)
    assert next_batch(deque(R() for _ in range(3)), policy, now=0.0).take == 2
    assert next_batch(deque(R() for _ in range(5)), policy, now=0.0).take == 4


def test_a_batch_that_would_pass_the_largest_preferred_size_goes_without_the_next():
    """Issue 28 item 9 (Triton's GetDynamicBatch): preferred [2, 6], a 3 then a 4: the 3 goes at
    once (3 + 4 passes 6), the 4 alone waits its own full delay; past the delay all pending goes."""
    policy = BatchPolicy(8, (2, 6), 10.0, True)
    decision = next_batch(deque([R(3, arrived=0.0), R(4, arrived=0.001)]), policy, now=0.002)
    assert (decision.take, decision.reason, decision.complete) == (1, "preferred batch size", False)
    decision = next_batch(deque([R(4, arrived=0.001)]), policy, now=0.003)
    assert (decision.take, decision.wake_at) == (0, 10.001)
    assert next_batch(deque([R(3, arrived=0.0), R(4, arrived=0.001)]), policy, now=10.0).take == 2


def test_shape_mismatch_stops_the_batch():
    queue = deque([R(shape_sig="a"), R(shape_sig="a"), R(shape_sig="b")])
    decision = next_batch(queue, DYN, now=0.0)
    assert (decision.take, decision.reason) == (2, "shape mismatch")


def test_client_batches_count_rows_and_are_never_split():
    queue = deque([R(batch_size=5), R(batch_size=4)])
    assert next_batch(queue, DYN, now=0.0).take == 1  # 5 + 4 > 8


def test_zero_delay_never_waits():
    policy = BatchPolicy(8, (), 0.0, True)
    assert next_batch(deque([R()]), policy, now=0.0).take == 1


@given(st.lists(st.integers(1, 8), min_size=1, max_size=30), st.floats(0, 0.1))
def test_batches_never_exceed_max_and_keep_order(sizes, now):
    queue = deque(R(batch_size=s) for s in sizes)
    decision = next_batch(queue, DYN, now)
    if decision.take:
        assert sum(sizes[: decision.take]) <= 8
    else:
        assert decision.wake_at is not None and sum(sizes) < 8
