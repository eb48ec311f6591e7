"""The prefix router's policy: longest match under a load cap, least loaded otherwise."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.scheduler.batching.prefix_router import LOAD_BLOCKS, RATIO, SLACK, PrefixRouter

SYSTEM = [11, 12, 13]  # a shared system prompt's blocks (chained: every conversation starts with them)


def conversation(n: int, turns: int) -> list[int]:
    return SYSTEM + [1000 * n + t for t in range(turns)]


def test_a_conversation_goes_back_to_the_instance_that_served_its_start():
    router: PrefixRouter[str] = PrefixRouter()
    router.routed(conversation(1, 2), "a")
    router.routed(conversation(2, 2), "b")
    assert router.choose(conversation(1, 4), {"a": 0, "b": 0}) == "a"
    assert router.choose(conversation(2, 4), {"a": 0, "b": 0}) == "b"
    assert router.matched(conversation(1, 4), "a") == 5
    assert router.matched(conversation(1, 4), "b") == 3  # the system prompt only


def test_no_match_and_ties_go_to_the_least_loaded():
    router: PrefixRouter[str] = PrefixRouter()
    router.routed(conversation(1, 1), "a")
    assert router.choose([1, 2, 3], {"a": 0, "b": 0}) == "b"  # a has one routed request
    router.routed(conversation(2, 1), "b")
    # a new conversation shares the system prompt with both: the tie goes by load, then order
    assert router.choose(conversation(3, 1), {"a": 1, "b": 0}) == "b"
    assert router.choose(conversation(3, 1), {"a": 0, "b": 0}) == "a"


def test_affinity_gives_way_to_an_instance_far_less_loaded():
    router: PrefixRouter[str] = PrefixRouter()
    for _ in range(10):
        router.routed(conversation(1, 3), "a")
    # a's 10 routed requests are over b's 0 + SLACK: the match no longer counts there
    assert router.choose(conversation(1, 4), {"a": 0, "b": 0}) == "b"
    # within the slack, the match wins over lower load
    near: PrefixRouter[str] = PrefixRouter()
    for _ in range(SLACK):
        near.routed(conversation(1, 3), "a")
    assert near.choose(conversation(1, 4), {"a": 0, "b": 0}) == "a"


def test_only_the_candidates_given_are_chosen_from():
    router: PrefixRouter[str] = PrefixRouter()
    router.routed(conversation(1, 3), "a")
    assert router.choose(conversation(1, 4), {"b": 3, "c": 1}) == "c"


def test_memory_is_bounded_and_forgets_the_least_recent():
    router: PrefixRouter[str] = PrefixRouter(capacity=2)
    router.routed([1, 2], "a")
    router.routed([3, 4], "b")
    assert router.matched([1, 2], "a") == 0
    assert router.matched([3, 4], "b") == 2
    assert len(router) == 2


def test_a_forgotten_instance_matches_nothing():
    router: PrefixRouter[str] = PrefixRouter()
    router.routed(conversation(1, 2), "a")
    router.routed(conversation(2, 2), "b")
    router.forget(lambda target: target == "a")
    assert router.matched(conversation(1, 2), "a") == 0
    assert router.matched(conversation(2, 2), "b") == 5


def test_load_counts_only_the_latest_decisions():
    router: PrefixRouter[str] = PrefixRouter(window=3)
    for target in ["a", "a", "b", "b", "b"]:
        router.routed([], target)
    assert router.load("a") == 0 and router.load("b", in_flight=2) == 5


def test_it_refuses_to_remember_nothing():
    with pytest.raises(ValueError):
        PrefixRouter(window=0)


targets = st.sampled_from(["a", "b", "c", "d"])
chains = st.lists(st.integers(0, 30), max_size=8)


@given(
    history=st.lists(st.tuples(chains, targets), max_size=40),
    blocks=chains,
    loads=st.dictionaries(targets, st.integers(0, 10), min_size=1),
)
def test_the_choice_costs_least_and_no_match_counts_over_the_cap(history, blocks, loads):
    router: PrefixRouter[str] = PrefixRouter(capacity=16, window=8)
    for chain, target in history:
        router.routed(chain, target)
    chosen = router.choose(blocks, loads)
    total = {t: router.load(t, busy) for t, busy in loads.items()}
    cap = max(min(total.values()) + SLACK, int(min(total.values()) * RATIO))

    def cost(t: str) -> int:
        return LOAD_BLOCKS * total[t] - (router.matched(blocks, t) if total[t] <= cap else 0)

    assert chosen in loads and all(cost(chosen) <= cost(t) for t in loads)
    if not any(router.matched(blocks, t) for t in loads if total[t] <= cap):
        assert total[chosen] == min(total.values())


@given(history=st.lists(st.tuples(chains, targets), max_size=60))
def test_it_never_holds_more_than_its_capacity(history):
    router: PrefixRouter[str] = PrefixRouter(capacity=10, window=5)
    for chain, target in history:
        router.routed(chain, target)
    assert len(router) <= 10
    assert sum(router.load(t) for t in "abcd") == min(len(history), 5)
