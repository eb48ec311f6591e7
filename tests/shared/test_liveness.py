"""Which workers count as gone: a loading worker gets longer, nobody is judged on a stale clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.liveness import LOADING_TIMEOUT_S, overdue


def test_a_silent_worker_is_overdue_after_the_timeout():
    seen = {"a": 0.0, "b": 4.0}
    assert overdue(seen, set(), 5.5, 5.0) == ["a"]


def test_a_loading_worker_is_not_overdue_until_the_loading_timeout():
    seen = {"a": 0.0}
    assert overdue(seen, {"a"}, 30.0, 5.0) == []
    assert overdue(seen, {"a"}, LOADING_TIMEOUT_S + 1, 5.0) == ["a"]


@given(
    st.dictionaries(st.sampled_from("abcdef"), st.floats(0, 100)),
    st.sets(st.sampled_from("abcdef")),
    st.floats(0, 200),
    st.floats(0.1, 100),
)
def test_loading_never_shortens_the_timeout(seen, loading, now, timeout):
    assert set(overdue(seen, loading, now, timeout)) <= set(overdue(seen, set(), now, timeout))
