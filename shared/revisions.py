"""How far a watch of a KV bucket has come, and a wait for it to reach a revision.

Every service keeps its own view of the models bucket by watching it; the views lag the
bucket by a message or two. A load answered to a client, or an ensemble step resolved
against a member that was just loaded, must not see an older view than the repository
wrote: whoever knows the revision it needs waits here for its watch to reach it.
"""

from __future__ import annotations

import asyncio


class Revisions:
    def __init__(self) -> None:
        self.latest = 0  # the newest revision applied: a watch delivers the bucket in order
        self._advanced = asyncio.Event()

    def advance(self, revision: int) -> None:
        """The watch applied the entry at `revision` (a replay after a reconnect repeats older ones)."""
        if revision > self.latest:
            self.latest = revision
            self._advanced.set()
            self._advanced = asyncio.Event()

    async def seen(self, revision: int, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) until the entry at `revision` is applied; whether it is."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.latest < revision:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._advanced.wait(), remaining)
            except asyncio.TimeoutError:
                return False
        return True
