"""The per-step limiter of `max_inflight_requests`: order, bound, withdrawal, cancellation."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.scheduler.ensembles.step_slots import Slots, StepSlots, Waiter


def test_grants_in_the_order_asked_up_to_the_limit():
    slots = Slots(2)
    granted: list[int] = []
    for i in range(5):
        slots.ask(Waiter(lambda i=i: granted.append(i) or True))
    assert granted == [0, 1] and slots.waiting == 3
    slots.give_back()
    assert granted == [0, 1, 2]
    slots.give_back(2)
    assert granted == [0, 1, 2, 3, 4] and slots.used == 2


def test_no_limit_grants_every_ask_at_once():
    slots = Slots(0)
    granted: list[int] = []
    for i in range(100):
        slots.ask(Waiter(lambda i=i: granted.append(i) or True))
    assert granted == list(range(100))


def test_a_withdrawn_waiter_is_skipped():
    slots = Slots(1)
    granted: list[str] = []
    gone = Waiter(lambda: granted.append("b") or True)
    for waiter in (Waiter(lambda: granted.append("a") or True), gone, Waiter(lambda: granted.append("c") or True)):
        slots.ask(waiter)
    gone.withdraw()
    slots.give_back()
    assert granted == ["a", "c"] and slots.used == 1


def test_giving_back_more_than_was_granted_is_a_defect():
    with pytest.raises(AssertionError):
        Slots(1).give_back()


@given(st.integers(1, 4), st.lists(st.sampled_from(["ask", "end", "withdraw"]), max_size=60))
def test_never_more_in_flight_than_the_limit_and_nothing_lost(limit: int, actions: list[str]):
    slots = Slots(limit)
    running: list[int] = []
    waiting = []
    asked = 0
    for action in actions:
        if action == "ask":
            waiting.append(Waiter(lambda n=asked: running.append(n) or True))
            slots.ask(waiting[-1])
            asked += 1
        elif action == "end" and running:
            running.pop(0)
            slots.give_back()
        elif action == "withdraw" and waiting:
            waiting.pop().withdraw()
        assert slots.used == len(running) <= limit
    # a waiter still asking is granted once the slots are free
    while running:
        running.pop(0)
        slots.give_back()
    assert slots.waiting == 0 or slots.used == limit


def test_acquire_waits_and_a_cancelled_wait_takes_no_slot():
    async def go() -> None:
        slots = Slots(1)
        await slots.acquire()
        waiting = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)
        assert not waiting.done()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        slots.give_back()
        assert slots.used == 0
        await asyncio.wait_for(slots.acquire(), 1)
        assert slots.used == 1

    asyncio.run(go())


def test_an_ensemble_reloaded_with_another_limit_gets_new_limiters():
    steps = StepSlots()
    first = steps.for_step(("E", 1), 2, 0)
    assert steps.for_step(("E", 1), 2, 0) is first
    changed = steps.for_step(("E", 1), 3, 0)
    assert changed is not first and changed.limit == 3
    steps.forget("E")
    assert steps.for_step(("E", 1), 3, 0) is not changed


def test_a_wait_cancelled_just_before_its_grant_takes_no_slot():
    """The task awaiting a slot is cancelled (its future with it) and, before its handler runs, a
    slot is given back: the grant is declined and the slot goes to the next in line."""

    async def go() -> None:
        slots = Slots(1)
        await slots.acquire()
        first = asyncio.create_task(slots.acquire())
        second = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)  # both wait
        first.cancel()  # its future is cancelled now; its handler runs only at its next step...
        slots.give_back()  # ...after the slot is freed
        await asyncio.wait_for(second, 1)
        with pytest.raises(asyncio.CancelledError):
            await first
        assert slots.used == 1

    asyncio.run(go())
