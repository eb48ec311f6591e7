"""shoal/autoscale/policy.py: the desired worker count from the signals, the count running and the
time; properties over any input (hypothesis), and the rules one by one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.autoscale.policy import Policy, Signals, State, decide

POLICY = Policy(min_replicas=1, max_replicas=8, target_queue_s=0.1, scale_up_cooldown_s=10, scale_down_cooldown_s=60)

policies = st.builds(
    lambda low, span, target, pending, util, up, down, idle: Policy(
        low, max(1, low + span), target, pending, util, up, down, idle
    ),
    st.integers(0, 4),
    st.integers(0, 8),
    st.floats(0.001, 10),
    st.sampled_from([0.0, 1.0, 4.0]),
    st.floats(0.05, 1.0),
    st.floats(0, 120),
    st.floats(0, 600),
    st.floats(0, 3600),
)
signals = st.builds(
    lambda pending, wait, busy, extra, requests, loads: Signals(pending, wait, busy, busy + extra, requests, loads),
    st.integers(0, 1000),
    st.floats(0, 100),
    st.integers(0, 64),
    st.integers(0, 64),
    st.integers(0, 10**6),
    st.integers(0, 3),
)
states = st.builds(
    State,
    st.one_of(st.just(float("-inf")), st.floats(0, 1000)),
    st.one_of(st.just(float("-inf")), st.floats(0, 1000)),
    st.one_of(st.none(), st.floats(0, 1000)),
    st.integers(-1, 10**6),
)


@settings(max_examples=300, deadline=None)
@given(policies, signals, st.integers(0, 20), st.floats(0, 2000), states)
def test_the_desired_count_stays_within_bounds_and_steps_down_by_one(policy, now_signals, replicas, now, state):
    decision = decide(policy, now_signals, replicas, now, state)
    assert policy.min_replicas <= decision.replicas <= policy.max_replicas
    if policy.min_replicas <= replicas <= policy.max_replicas and decision.replicas < replicas:
        assert decision.replicas == replicas - 1 or decision.replicas == 0  # one at a time, or idle to zero
        assert now - state.last_change >= policy.scale_down_cooldown_s
        assert now_signals.oldest_wait_s <= policy.target_queue_s / 2  # nothing waited long
    if decision.replicas != replicas:
        assert decision.state.last_change == now
    else:
        assert decision.state.last_change == state.last_change


@settings(max_examples=300, deadline=None)
@given(policies, signals, st.integers(1, 20), st.floats(0, 2000), states, st.floats(0, 100))
def test_more_waiting_never_wants_fewer_workers(policy, now_signals, replicas, now, state, more):
    calm = decide(policy, now_signals, replicas, now, state)
    pressed = Signals(
        now_signals.pending + 1,
        now_signals.oldest_wait_s + more,
        now_signals.busy_instances,
        now_signals.instances,
        now_signals.requests,
        now_signals.loads,
    )
    assert decide(policy, pressed, replicas, now, state).replicas >= min(calm.replicas, replicas)


@settings(max_examples=200, deadline=None)
@given(policies, st.integers(1, 1000), st.floats(0, 2000), states)
def test_a_request_at_zero_starts_a_worker_at_once(policy, pending, now, state):
    decision = decide(policy, Signals(pending=pending), 0, now, state)
    assert decision.replicas == max(1, policy.min_replicas)
    on_demand = decide(policy, Signals(loads=1), 0, now, state)
    assert on_demand.replicas == max(1, policy.min_replicas)


def test_pressure_scales_up_by_its_ratio_at_most_doubling_then_cools_down():
    state = State()
    decision = decide(POLICY, Signals(pending=5, oldest_wait_s=0.15), 2, 100.0, state)
    assert decision.replicas == 3  # 1.5x the target: ceil(2 * 1.5)
    again = decide(POLICY, Signals(pending=50, oldest_wait_s=5.0), 3, 105.0, decision.state)
    assert again.replicas == 3 and "cooling" in again.reason  # within the up cool-down
    later = decide(POLICY, Signals(pending=50, oldest_wait_s=5.0), 3, 111.0, again.state)
    assert later.replicas == 6  # 50x the target, but at most doubling
    capped = decide(POLICY, Signals(pending=50, oldest_wait_s=5.0), 6, 122.0, later.state)
    assert capped.replicas == 8  # --max


def test_pending_per_worker_is_a_target_of_its_own():
    policy = Policy(max_replicas=8, target_pending=4.0, scale_up_cooldown_s=0)
    assert decide(policy, Signals(pending=12, oldest_wait_s=0.0), 2, 0.0, State()).replicas == 3


def test_slack_held_for_the_down_cool_down_removes_one_worker():
    idle = Signals(pending=0, oldest_wait_s=0.0, busy_instances=1, instances=4, requests=10)
    first = decide(POLICY, idle, 4, 1000.0, State(last_change=900.0))
    assert first.replicas == 4 and first.state.slack_since == 1000.0
    held = decide(POLICY, idle, 4, 1030.0, first.state)
    assert held.replicas == 4  # slack for 30 s of the 60
    gone = decide(POLICY, idle, 4, 1061.0, held.state)
    assert gone.replicas == 3 and gone.state.slack_since is None
    next_one = decide(POLICY, idle, 3, 1100.0, gone.state)
    assert next_one.replicas == 3  # the cool-down runs from the last change again


def test_a_busy_deployment_keeps_its_workers():
    busy = Signals(pending=0, oldest_wait_s=0.01, busy_instances=4, instances=4)
    assert decide(POLICY, busy, 4, 1000.0, State(slack_since=0.0)).replicas == 4


def test_no_request_for_the_idle_window_scales_to_zero_and_a_request_brings_one_back():
    policy = Policy(min_replicas=0, max_replicas=4, idle_window_s=120, scale_down_cooldown_s=30)
    used = Signals(busy_instances=2, instances=2, requests=7)  # no slack: the rule of the idle window alone
    state = decide(policy, used, 2, 0.0, State()).state
    used = Signals(busy_instances=2, instances=2, requests=8)
    assert decide(policy, used, 2, 60.0, state).replicas == 2  # a request 60 s in
    state = decide(policy, used, 2, 60.0, state).state
    assert decide(policy, used, 2, 150.0, state).replicas == 2  # 90 s since it
    zero = decide(policy, used, 2, 181.0, state)
    assert zero.replicas == 0
    assert decide(policy, Signals(requests=8), 0, 500.0, zero.state).replicas == 0
    assert decide(policy, Signals(loads=1, requests=8), 0, 501.0, zero.state).replicas == 1


def test_a_controller_just_started_keeps_a_deployment_whose_queue_is_empty_for_now():
    """No look yet says when the last request came: the idle window counts from the first look
    (a first look at -inf took a busy deployment to zero at once, tests/deploy/test_swarm.py saw it)."""
    policy = Policy(min_replicas=0, max_replicas=4, idle_window_s=10, scale_down_cooldown_s=5)
    serving = Signals(busy_instances=1, instances=1, requests=500)
    first = decide(policy, serving, 1, 1000.0, State())
    assert first.replicas == 1
    assert decide(policy, serving, 1, 1009.0, first.state).replicas == 1
    assert decide(policy, serving, 1, 1010.0, first.state).replicas == 0  # no request since: idle


def test_outside_the_bounds_comes_back_at_once():
    assert decide(POLICY, Signals(), 0, 0.0, State(last_change=0.0)).replicas == 1
    assert decide(POLICY, Signals(), 12, 0.0, State(last_change=0.0)).replicas == 8


def test_a_policy_refuses_bounds_that_cannot_hold():
    with pytest.raises(ValueError):
        Policy(min_replicas=3, max_replicas=2)
    with pytest.raises(ValueError):
        Policy(max_replicas=0)
