"""`max_inflight_requests`: one limit per ensemble step, shared by every request of the ensemble.

Triton bounds the step requests in flight at each step of an ensemble across all its ongoing
requests (core PR 482, server PR 8707: one limiter per step, owned by the ensemble model, a slot
taken before a step request is sent and given back when its final response arrives). The bound
stops a fast upstream step from piling intermediates up in front of a slow downstream one,
whether the upstream is a decoupled producer or just many requests at once.

`Slots` is that limiter: slots are granted in the order they were asked for, across requests, and
a waiter that gave up (its request failed or was cancelled) is skipped. Granting calls back
synchronously, so a decoupled stream (`stream.py`) keeps its launches in order without a task per
waiting launch; the ordinary dataflow awaits a slot with `acquire`. The limit holds per scheduler
replica: replicas of one ensemble each bound their own requests (docs/triton-spec.md §3.5).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable


class Waiter:
    """One launch waiting for a slot; `withdraw()` when it no longer wants one. `grant()` takes the
    slot and says whether it did (False: it gave up a moment ago, the slot goes to the next)."""

    __slots__ = ("grant", "withdrawn")

    def __init__(self, grant: Callable[[], bool]) -> None:
        self.grant = grant
        self.withdrawn = False

    def withdraw(self) -> None:
        self.withdrawn = True


class Slots:
    """A step's slots (`limit` 0: no bound, every ask is granted at once)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiting: deque[Waiter] = deque()

    def ask(self, waiter: Waiter) -> None:
        """`waiter.grant()` is called (now, or when a slot is given back) once a slot is its own; the
        caller holds the waiter before asking, since the grant may come before `ask` returns."""
        self._waiting.append(waiter)
        self._hand_out()

    def give_back(self, count: int = 1) -> None:
        """Slots granted earlier are free again (their step requests ended)."""
        self.used -= count
        assert self.used >= 0, "a slot given back twice"
        self._hand_out()

    async def acquire(self) -> None:
        """Wait (in order with every other ask) for a slot; cancelling the wait takes none."""
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def take() -> bool:
            if granted.done():  # its wait was cancelled before the withdrawal below could run
                return False
            granted.set_result(None)
            return True

        waiter = Waiter(take)
        self.ask(waiter)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.give_back()  # granted as the wait was cancelled: nobody will use it
            else:
                waiter.withdraw()
            raise

    @property
    def waiting(self) -> int:
        return sum(not w.withdrawn for w in self._waiting)

    def _hand_out(self) -> None:
        while self._waiting and (not self.limit or self.used < self.limit):
            waiter = self._waiting.popleft()
            if waiter.withdrawn:
                continue
            self.used += 1
            if not waiter.grant():
                self.used -= 1


class StepSlots:
    """Every ensemble's step limiters, by (ensemble, version); a new limit (the ensemble reloaded
    with another config) makes new limiters, while requests that hold slots of the old ones give
    them back there."""

    def __init__(self) -> None:
        self._slots: dict[tuple[str, int], tuple[int, dict[int, Slots]]] = {}

    def for_step(self, key: tuple[str, int], limit: int, index: int) -> Slots:
        held = self._slots.get(key)
        if held is None or held[0] != limit:
            held = (limit, {})
            self._slots[key] = held
        return held[1].setdefault(index, Slots(limit))

    def in_use(self) -> int:
        """Slots held now, over every limiter (a request that ended holds none)."""
        return sum(slots.used for _, steps in self._slots.values() for slots in steps.values())

    def forget(self, name: str) -> None:
        """The ensemble is gone: its limiters go with it (requests holding slots keep theirs)."""
        for key in [k for k in self._slots if k[0] == name]:
            del self._slots[key]
