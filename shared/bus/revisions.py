"""How far a watch of a KV bucket has come, and a wait for it to reach a revision.

Every service keeps its own view of the models bucket by watching it; the views lag the
bucket by a message or two. A load answered to a client, or an ensemble step resolved
against a member that was just loaded, must not see an older view than the repository
wrote: whoever knows the revision it needs waits here for its watch to reach it.
"""

from __future__ import annotations

import asyncio
import logging

from nats.js.kv import KeyValue

log = logging.getLogger(__name__)
CATCH_UP_S = 2.0  # a watch lags by milliseconds; past this the view's own answer stands


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

    async def catch_up(self, kv: KeyValue, timeout: float = CATCH_UP_S) -> bool:
        """Wait (at most `timeout` seconds) for this view to reach `kv`'s newest revision: whether
        it moved on meanwhile. For a view about to answer "no such model" that may only be behind
        (a model loaded a moment ago by another process): one bucket status request, no wait when
        the view is current."""
        before = self.latest
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            status = await asyncio.wait_for(kv.status(), timeout)
        except Exception as exc:  # the bus is away or slow: the view's own answer stands
            log.debug("models bucket status: %s", exc)
            return False
        await self.seen(status.stream_info.state.last_seq or 0, max(0.0, deadline - loop.time()))
        return self.latest > before
