"""Telling each dispatcher which of its request groups this scheduler took (shared/bus/holders.py).

An acknowledgement per group was one more bus message per request at batch 1 (5 instead of 4:
docs/performance.md). The dispatcher only needs to know who holds its requests within about a
second (`holders.UNACKED_S`), so the groups taken from one inbox are listed in one `HeldGroups`
message at most every `DELAY_S`. The first group from an inbox not heard from for a second is
acknowledged at once: until a dispatcher knows a scheduler, it cannot ask whether it lives (a
dispatcher restarted with the same inbox has forgotten the schedulers it knew).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from shared.wire import subjects
from shared.wire.messages import HeldGroups, encode

log = logging.getLogger("shoal.scheduler")

DELAY_S = 0.1  # well under holders.UNACKED_S (1 s) and holders.MIN_AGE_S (0.3 s)
QUIET_S = 1.0  # an inbox not heard from for this long gets its next acknowledgement at once
_KNOWN_LIMIT = 4096  # inboxes remembered (restarted processes bring new ones)

Publish = Callable[..., Awaitable[None]]


class Acknowledgements:
    def __init__(self, publish: Publish, alive_subject: str, delay_s: float = DELAY_S) -> None:
        self._publish = publish
        self._headers = {subjects.HELD_BY_HEADER: alive_subject}
        self._delay_s = delay_s
        self._due: dict[str, list[str]] = {}  # inbox -> groups taken since its last acknowledgement
        self._heard: dict[str, float] = {}  # inbox -> when it last sent a group
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Task[None] | None = None

    async def took(self, reply: str) -> None:
        """A request group arrived with this reply subject (`<inbox>.<group>`)."""
        inbox, _, group = reply.rpartition(".")
        now = time.monotonic()
        last = self._heard.get(inbox)
        if len(self._heard) >= _KNOWN_LIMIT and last is None:
            self._heard.clear()
        self._heard[inbox] = now
        if last is None or now - last > QUIET_S:
            await self._send(inbox, [group])
            return
        due = self._due.get(inbox)
        if due is None:
            self._due[inbox] = [group]
        else:
            due.append(group)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay_s, self._flush_soon)

    async def stop(self) -> None:
        """Send what is due now (a scheduler stopping still holds those requests until it drains)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self.flush()

    def _flush_soon(self) -> None:
        self._timer = None
        self._flushing = asyncio.get_running_loop().create_task(self.flush())

    async def flush(self) -> None:
        due, self._due = self._due, {}
        for inbox, groups in due.items():
            await self._send(inbox, groups)

    async def _send(self, inbox: str, groups: list[str]) -> None:
        try:
            await self._publish(subjects.held_groups(inbox), encode(HeldGroups(groups)), headers=self._headers)
        except Exception as exc:  # the bus is down: the dispatcher pings its schedulers instead
            log.debug("could not acknowledge %d request group(s) to %s: %s", len(groups), inbox, exc)
