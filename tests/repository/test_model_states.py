"""services/repository/model_states.py: a model version's state machine (pure logic): loads,
unloads, the workers' reports and ensembles' members."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.repository import model_states as ms
from shared.wire.records import UNLOADED, InstanceRecord, ModelState, ModelVersionState
from tests.repository.ensemble_records import ensemble, member

states = st.builds(ModelVersionState, st.sampled_from(list(ModelState)), st.sampled_from(["", "why", ms.NO_INSTANCES]))
version_states = st.dictionaries(st.integers(1, 6).map(str), states, max_size=4)
versions = st.lists(st.integers(1, 6), unique=True, max_size=4)
reports = st.lists(
    st.builds(
        lambda generation, state, serving, reason: InstanceRecord(
            "w", "m", 1, generation, state, reason, serving_generation=serving
        ),
        st.integers(1, 4),
        st.sampled_from([ModelState.READY, ModelState.LOADING, ModelState.UNAVAILABLE]),
        st.sampled_from([0, 0, 1, 3]),
        st.sampled_from(["", "no", "nope"]),
    ),
    max_size=4,
)


def report(generation: int, state: ModelState, serving: int = 0, reason: str = "") -> InstanceRecord:
    return InstanceRecord("w", "m", 1, generation, state, reason, serving_generation=serving)


# -- loads and unloads -----------------------------------------------------------------
@given(versions, version_states)
def test_a_load_loads_its_versions_keeps_the_ready_ones_serving_and_drops_the_others(hosted, previous):
    after = ms.loaded(hosted, previous)
    assert set(after) == set(previous) | {str(v) for v in hosted}
    for key, state in after.items():
        if int(key) not in hosted:
            assert state == ModelVersionState(ModelState.UNAVAILABLE, UNLOADED)
        elif key in previous and previous[key].state == ModelState.READY:
            assert state == previous[key]  # it serves until the new generation swaps in
        else:
            assert state == ModelVersionState(ModelState.LOADING)


@given(versions)
def test_a_failed_load_makes_every_version_it_named_unavailable_with_the_error(named):
    assert ms.failed_load(named, "bad") == {
        str(v): ModelVersionState(ModelState.UNAVAILABLE, "bad") for v in named or [1]
    }


@given(versions, version_states, reports, st.integers(1, 4))
def test_an_unload_holds_its_versions_against_every_report_until_it_ends(hosted, previous, seen, generation):
    during = {**previous, **ms.unloading(hosted)}
    for version in hosted:
        derived = ms.from_reports(seen, generation, during[str(version)])
        assert ms.follow(during[str(version)], derived) == ModelVersionState(ModelState.UNLOADING)
    assert ms.unloaded(hosted) == {str(v): ModelVersionState(ModelState.UNAVAILABLE, UNLOADED) for v in hosted}


@given(st.none() | states, states)
def test_outside_an_unload_a_version_follows_what_its_reports_or_members_say(previous, derived):
    unloading = previous is not None and previous.state == ModelState.UNLOADING
    assert ms.follow(previous, derived) == (previous if unloading else derived)


# -- the workers' reports --------------------------------------------------------------
@given(reports, st.integers(1, 4), states)
def test_a_version_is_ready_exactly_while_an_instance_serves(seen, generation, previous):
    state = ms.from_reports(seen, generation, previous)
    assert (state.state == ModelState.READY) == any(r.serving_generation for r in seen)
    assert state.state in (ModelState.READY, ModelState.LOADING, ModelState.UNAVAILABLE)
    if state.state == ModelState.UNAVAILABLE and seen:  # every worker failed this generation
        current = [r for r in seen if r.generation == generation]
        assert current and all(r.state == ModelState.UNAVAILABLE for r in current)
        assert state.reason == current[0].reason


def test_a_version_is_ready_while_any_instance_serves():
    seen = [report(3, ModelState.UNAVAILABLE, reason="no"), report(3, ModelState.LOADING, serving=2)]
    assert ms.from_reports(seen, 3, ms.LOADING) == ModelVersionState(ModelState.READY)


def test_a_version_is_unavailable_when_every_worker_failed_this_generation():
    seen = [report(3, ModelState.UNAVAILABLE, reason="no"), report(3, ModelState.UNAVAILABLE, reason="nope")]
    assert ms.from_reports(seen, 3, ms.LOADING) == ModelVersionState(ModelState.UNAVAILABLE, "no")
    # a worker still on the previous generation is not a failure of this one
    assert ms.from_reports([*seen, report(2, ModelState.LOADING)], 4, ms.LOADING) == ms.LOADING


@given(states)
def test_no_reports_is_loading_unless_its_instances_died_with_their_workers(previous):
    state = ms.from_reports([], 1, previous)
    if previous.state == ModelState.READY or previous.reason == ms.NO_INSTANCES:
        assert state == ModelVersionState(ModelState.UNAVAILABLE, ms.NO_INSTANCES)
    else:
        assert state == ModelVersionState(ModelState.LOADING)


@given(reports, st.integers(1, 4))
def test_reports_are_settled_once_every_worker_finished_trying_the_generation(seen, generation):
    finished = all(r.generation == generation and r.state != ModelState.LOADING for r in seen)
    assert ms.reports_settled(seen, generation) == (bool(seen) and finished)


@given(st.lists(states, max_size=4))
def test_settled_and_the_first_failure(listed):
    assert ms.settled(listed) == all(s.state != ModelState.LOADING for s in listed)
    failed = [s.reason for s in listed if s.state != ModelState.READY]
    assert ms.first_failure(listed) == (failed[0] if failed else None)


# -- ensembles -------------------------------------------------------------------------
def test_an_ensemble_is_ready_when_every_member_is():
    records = {"a": member("a"), "b": member("b"), "e": ensemble("e", ["a", "b"])}
    assert ms.ensemble(records["e"], records, {"a", "b", "e"}) == ModelVersionState(ModelState.READY)


def test_an_ensemble_loads_while_a_member_loads_or_is_about_to():
    records = {"a": member("a", ModelState.LOADING), "e": ensemble("e", ["a", "b"])}
    assert ms.ensemble(records["e"], records, {"a", "b", "e"}).state == ModelState.LOADING


def test_an_ensemble_is_unavailable_with_the_reason():
    records = {"a": member("a"), "b": member("b", ModelState.UNAVAILABLE), "e": ensemble("e", ["a", "b"])}
    assert ms.ensemble(records["e"], records, set(records)) == ModelVersionState(
        ModelState.UNAVAILABLE, "ensemble 'e' depends on 'b' which has no loaded version"
    )
    records["b"] = member("b", reason="bad config")
    assert ms.ensemble(records["e"], records, set(records)).reason == "ensemble 'e' depends on 'b' which is not valid"
    del records["b"]
    # not in the repository at all
    assert ms.ensemble(records["e"], records, {"a", "e"}).state == ModelState.UNAVAILABLE


def test_an_ensemble_that_is_not_connected_names_its_models():
    assert ms.not_connected("e", ["a", "b"]) == ModelVersionState(
        ModelState.UNAVAILABLE, "ensemble e contains models that are not available or ambiguous: a, b"
    )
