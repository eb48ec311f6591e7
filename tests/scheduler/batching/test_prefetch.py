"""The prefetch rule: a batch goes to an instance still running one only when the batch formed
now is the one Triton would form when the instance frees."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from services.scheduler.batching.formation import BatchPolicy, Decision, next_batch
from services.scheduler.batching.prefetch import may_prefetch
from services.scheduler.batching.queues import Priorities


@dataclass
class R:
    batch_size: int = 1
    shape_sig: str = ""
    arrived: float = 0.0


PLAIN = Priorities.from_json({})
COMPLETE = Decision(4, "max batch size", complete=True)
GROWING = Decision(2, "no queue delay")


def test_a_complete_batch_of_a_plain_queue_may_go_ahead():
    assert may_prefetch(PLAIN, False, COMPLETE)


def test_a_batch_that_could_still_grow_waits_for_a_free_instance():
    assert not may_prefetch(PLAIN, False, GROWING)


def test_the_default_scheduler_sends_ahead():
    decision = next_batch(deque([R(), R()]), BatchPolicy(8), now=0.0)
    assert decision.complete and may_prefetch(PLAIN, False, decision)


def test_priorities_queue_policies_and_the_rate_limiter_forbid_it():
    forbidding = [
        {"priority_levels": 2},
        {"default_queue_policy": {"max_queue_size": 4}},
        {"default_queue_policy": {"default_timeout_microseconds": 1000}},
        {"default_queue_policy": {"allow_timeout_override": True}},
        {"priority_levels": 1, "priority_queue_policy": {"1": {"default_timeout_microseconds": 5}}},
    ]
    for batching in forbidding:
        assert not may_prefetch(Priorities.from_json(batching), False, COMPLETE), batching
    assert not may_prefetch(PLAIN, True, COMPLETE)
    assert may_prefetch(Priorities.from_json({"priority_levels": 1}), False, COMPLETE)


def test_delay_and_preferred_sizes_do_not_make_a_waiting_batch_complete():
    policy = BatchPolicy(8, (2, 4), 0.01, True)
    decision = next_batch(deque([R(), R()]), policy, now=0.0)  # a preferred size, delay not expired
    assert decision.take == 2 and not decision.complete


requests = st.lists(st.builds(R, st.integers(1, 4), st.sampled_from(["a", "b"])), min_size=1, max_size=12)
policies = st.builds(
    BatchPolicy,
    st.integers(0, 8),
    st.lists(st.integers(1, 8), max_size=3).map(lambda p: tuple(sorted(set(p)))),
    st.sampled_from([0.0, 0.01]),
    st.booleans(),
)


@given(requests, requests, policies, st.floats(0, 1))
def test_a_batch_sent_ahead_is_the_batch_formed_when_the_instance_frees(queued, later, policy, waited):
    """Whatever arrives meanwhile (behind it: one priority level) and however long the running
    batch takes, the batch formed when the instance frees is the one formed now."""
    now = next_batch(deque(queued), policy, now=0.0)
    if may_prefetch(PLAIN, False, now):
        then = next_batch(deque(queued + later), policy, now=waited)
        assert then.take == now.take  # the reason may differ: the same batch, sent once its delay expired
