"""On-demand placement and eviction decisions (services/repository/eviction.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.repository.eviction import COUNT, MEMORY, Resident, Room, place, victims

MIB = 1 << 20


def test_a_model_fits_where_there_is_room() -> None:
    full = Room("a", 0, 1, (Resident("x", MIB, 1.0),))
    empty = Room("b", 0, 1)
    assert place([full, empty], MIB).worker == "b"
    assert place([full, empty], MIB).evict == ()


def test_the_least_recently_used_idle_unpinned_model_goes_first() -> None:
    room = Room(
        "a",
        0,
        3,
        (
            Resident("oldest_busy", MIB, 1.0, busy=True),
            Resident("old_pinned", MIB, 2.0, pinned=True),
            Resident("old", MIB, 3.0),
        ),
    )
    placement = place([room], MIB)
    assert placement is not None and [r.name for r in placement.evict] == ["old"] and placement.reason == COUNT


def test_memory_budget_evicts_until_the_estimate_fits() -> None:
    room = Room("a", 10 * MIB, 0, (Resident("a", 4 * MIB, 1.0), Resident("b", 4 * MIB, 2.0), Resident("c", MIB, 3.0)))
    placement = place([room], 5 * MIB)
    assert placement is not None and [r.name for r in placement.evict] == ["a"] and placement.reason == MEMORY


def test_nothing_evictable_is_no_placement() -> None:
    room = Room("a", 0, 1, (Resident("x", MIB, 1.0, busy=True),))
    assert place([room], MIB) is None
    assert place([Room("a", 0, 1, (Resident("x", MIB, 1.0, pinned=True),))], MIB) is None


def test_an_empty_worker_takes_a_model_larger_than_its_budget() -> None:
    assert place([Room("a", MIB, 0)], 10 * MIB) is not None


residents = st.lists(
    st.builds(
        Resident,
        name=st.text("abcdefgh", min_size=1, max_size=4),
        size=st.integers(0, 8 * MIB),
        last_used=st.floats(0, 1e6),
        busy=st.booleans(),
        pinned=st.booleans(),
    ),
    max_size=8,
    unique_by=lambda r: r.name,
)


@given(residents, st.integers(0, 32 * MIB), st.integers(0, 6), st.integers(0, 8 * MIB))
def test_victims_are_idle_unpinned_oldest_first_and_make_room(
    held: list[Resident], budget: int, max_models: int, size: int
) -> None:
    room = Room("w", budget, max_models, tuple(held))
    chosen = victims(room, size)
    evictable = sorted((r for r in held if not r.busy and not r.pinned), key=lambda r: r.last_used)
    if chosen is None:  # even evicting every idle unpinned model is not enough
        assert not room.fits(size, evictable)
        return
    assert list(chosen) == evictable[: len(chosen)]  # a prefix of the least recently used
    assert room.fits(size, chosen)
    staying = [r for r in held if r not in chosen]
    if staying:  # the budget holds, except for the one model an empty worker always takes
        assert not max_models or len(staying) + 1 <= max_models
        assert not budget or sum(r.size for r in staying) + size <= budget
    if chosen:  # no fewer would do
        assert not room.fits(size, chosen[:-1])
