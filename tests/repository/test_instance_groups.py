"""The instance processes of a python model count as one report: loaded when all are, failed when
one failed, serving on while one restarts after the group served whole."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.repository.instance_groups import fold
from shared.wire.records import InstanceRecord, ModelState

READY, LOADING, UNAVAILABLE = ModelState.READY, ModelState.LOADING, ModelState.UNAVAILABLE


def member(
    index: int, state: ModelState, generation: int = 1, serving: int = 0, size: int = 2, reason: str = ""
) -> InstanceRecord:
    return InstanceRecord(
        f"w-py-m-{index}",
        "m",
        1,
        generation,
        state,
        reason,
        count=1,
        serving_generation=serving,
        rss_bytes=10,
        group="w-py-m",
        group_size=size,
    )


def one(reports: list[InstanceRecord], whole: dict | None = None) -> InstanceRecord:
    (folded,) = fold(reports, {} if whole is None else whole)
    return folded


def test_a_group_serves_once_every_instance_has_loaded():
    first = one([member(0, READY, serving=1)])
    assert (first.state, first.serving_generation) == (LOADING, 0)  # the other has not reported yet
    second = one([member(0, READY, serving=1), member(1, LOADING)])
    assert (second.state, second.serving_generation) == (LOADING, 0)
    both = one([member(0, READY, serving=1), member(1, READY, serving=1)])
    assert (both.state, both.serving_generation, both.count, both.rss_bytes) == (READY, 1, 2, 20)
    assert both.worker == "w-py-m"


def test_one_instance_failing_fails_the_group():
    folded = one([member(0, READY, serving=1), member(1, UNAVAILABLE, reason="initialize raised")])
    assert (folded.state, folded.serving_generation, folded.reason) == (UNAVAILABLE, 0, "initialize raised")


def test_a_restarting_instance_leaves_the_others_serving_what_the_group_served_whole():
    whole: dict = {}
    assert one([member(0, READY, serving=1), member(1, READY, serving=1)], whole).serving_generation == 1
    crashed = one([member(0, READY, serving=1)], whole)  # instance 1's process died: its report went
    assert crashed.serving_generation == 1 and crashed.state == LOADING
    restarting = one([member(0, READY, serving=1), member(1, LOADING)], whole)
    assert restarting.serving_generation == 1
    assert one([member(0, READY, serving=1), member(1, READY, serving=1)], whole).state == READY


def test_a_reload_serves_the_old_generation_until_the_last_instance_swapped():
    whole: dict = {}
    swapping = one([member(0, READY, 2, serving=2), member(1, LOADING, 2, serving=1)], whole)
    assert (swapping.state, swapping.serving_generation, swapping.generation) == (LOADING, 1, 2)
    failed = one([member(0, READY, 2, serving=2), member(1, UNAVAILABLE, 2, serving=1, reason="bad")], whole)
    assert (failed.state, failed.serving_generation) == (UNAVAILABLE, 1)  # the old one keeps serving
    done = one([member(0, READY, 2, serving=2), member(1, READY, 2, serving=2)], whole)
    assert (done.state, done.serving_generation) == (READY, 2)


def test_a_reload_to_more_instances_serves_the_old_generation_until_the_new_one_has_them_all():
    whole: dict = {}
    assert one([member(0, READY, serving=1), member(1, READY, serving=1)], whole).serving_generation == 1
    growing = [member(0, READY, 2, serving=2, size=3), member(1, READY, 2, serving=2, size=3)]
    assert one(growing, whole).serving_generation == 1  # the third has not reported yet
    assert one([*growing, member(2, LOADING, 2, size=3)], whole).serving_generation == 1
    done = one([*growing, member(2, READY, 2, serving=2, size=3)], whole)
    assert (done.state, done.serving_generation) == (READY, 2)


def test_an_instance_whose_is_ready_says_no_makes_the_group_serve_nothing():
    folded = one([member(0, READY, serving=1), member(1, UNAVAILABLE, serving=0, reason="not ready")])
    assert folded.serving_generation == 0 and folded.state == UNAVAILABLE


def test_reports_outside_groups_pass_unchanged():
    plain = InstanceRecord("w", "m", 1, 1, READY, serving_generation=1)
    assert fold([plain], {}) == [plain]


states = st.sampled_from([READY, LOADING, UNAVAILABLE])


@given(st.lists(st.tuples(states, st.integers(0, 3)), min_size=1, max_size=4), st.integers(1, 4))
def test_a_group_never_serves_a_generation_an_instance_does_not(members, size):
    reports = [member(i, state, 3, serving=serving, size=size) for i, (state, serving) in enumerate(members)]
    folded = one(reports)  # no history: nothing served whole before
    started = [r for r in reports if r.state != LOADING or r.serving_generation]  # not a process starting
    if folded.serving_generation:
        assert len(started) >= size
        assert all(r.serving_generation >= folded.serving_generation for r in started)
    if folded.state == READY:
        assert len(reports) >= size and all(r.state == READY for r in reports)
