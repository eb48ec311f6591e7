"""Telling each dispatcher which of its request groups this scheduler took (shared/holders.py).

An acknowledgement per group was one more bus message per request at batch 1 (5 instead of 4:
docs/performance.md). The dispatcher only needs to know who holds its requests within about a
second (`holders.UNACKED_S`), so the groups taken from one inbox are listed in one `HeldGroups`
message at most every `DELAY_S`. The first group from an inbox not heard from before is
acknowledged at once: until a dispatcher knows a scheduler, it cannot ask whether it lives.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from shared import subjects
from shared.messages import HeldGroups, encode

log = logging.getLogger("shoal.scheduler")

DELAY_S = 0.1  # well under holders.UNACKED_S (1 s) and holders.MIN_AGE_S (0.3 s)
_KNOWN_LIMIT = 4096  # inboxes remembered as acknowledged before (restarted processes bring new ones)

Publish = Callable[..., Awaitable[None]]


class Acknowledgements:
    def __init__(self, publish: Publish, alive_subject: str, delay_s: float = DELAY_S) -> None:
        self._publish = publish
        self._headers = {subjects.HELD_BY_HEADER: alive_subject}
        self._delay_s = delay_s
        self._due: dict[str, list[str]] = {}  # inbox -> groups taken since its last acknowledgement
        self._known: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None

    async def took(self, reply: str) -> None:
        """A request group arrived with this reply subject (`<inbox>.<group>`)."""
        inbox, _, group = reply.rpartition(".")
        if inbox not in self._known:
            if len(self._known) >= _KNOWN_LIMIT:
                self._known.clear()
            self._known.add(inbox)
            await self._send(inbox, [group])
            return
        due = self._due.get(inbox)
        if due is None:
            self._due[inbox] = [group]
        else:
            due.append(group)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay_s, self._flush_soon)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _flush_soon(self) -> None:
        self._timer = None
        asyncio.get_running_loop().create_task(self.flush())

    async def flush(self) -> None:
        due, self._due = self._due, {}
        for inbox, groups in due.items():
            await self._send(inbox, groups)

    async def _send(self, inbox: str, groups: list[str]) -> None:
        try:
            await self._publish(subjects.held_groups(inbox), encode(HeldGroups(groups)), headers=self._headers)
        except Exception as exc:  # the bus is down: the dispatcher pings its schedulers instead
            log.debug("could not acknowledge %d request group(s) to %s: %s", len(groups), inbox, exc)
