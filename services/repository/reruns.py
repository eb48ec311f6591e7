"""One async job per key that never runs twice at once and never drops a request: asked for while
it runs, it runs again once the running one ends. The manager refreshes an ensemble's state this way:
a refresh awaits its publish, a member's report can come meanwhile, and dropping the refresh it asks
for left the ensemble LOADING after its member was READY."""

from __future__ import annotations

from collections.abc import Awaitable, Callable


class Reruns:
    def __init__(self) -> None:
        self._running: set[str] = set()
        self._asked: set[str] = set()  # asked for again while running

    async def run(self, key: str, job: Callable[[], Awaitable[None]]) -> None:
        """`job()` now, or, when `key`'s job runs already (a nested or concurrent call), once more after it."""
        self._asked.add(key)
        if key in self._running:
            return
        self._running.add(key)
        try:
            while key in self._asked:
                self._asked.discard(key)
                await job()
        finally:
            self._running.discard(key)
            self._asked.discard(key)
